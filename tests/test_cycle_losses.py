"""research.cycle_losses: cycles read from an answer file, copy positions, the summary numbers."""
from __future__ import annotations

import gzip
import json

import pytest
import torch

from eagle.train import train as T
from research import cycle_losses as C


def _prompt_ids(messages):
    # a fake prompt format: one token per user message (its length), 0 between turns
    out = []
    for m in messages:
        out += [len(m["content"]) % 50 + 100, 0]
    return out


def _record(ids_per_turn, accept_per_turn, qid=1):
    return {"question_id": qid, "choices": [{
        "turns": ["x" * len(t) for t in ids_per_turn], "new_token_ids": ids_per_turn,
        "decoding_steps": [len(a) for a in accept_per_turn],
        "accept_lengths": [x for a in accept_per_turn for x in a]}]}


def test_cycle_records_start_after_the_prefill_token_and_flag_copies():
    q = {"turns": ["hello"]}
    ids = [7, 8, 9, 7, 8, 9, 4]             # token 5 (9) continues the 2-gram (7, 8) seen at 0..1: a copy
    rec = _record([ids], [[2, 1, 1, 2, 1]])  # 1 (prefill) + 2 + 1 + 1 + 2 = 7 tokens
    cyc = C.cycle_records(rec, q, _prompt_ids)
    assert [c["start"] for c in cyc] == [1, 3, 4, 5]  # the last cycle (start 7) had nothing left to hit
    assert [c["a"] for c in cyc] == [2, 1, 1, 2]
    assert [c["copy"] for c in cyc] == [False, False, False, True]


def test_cycle_records_second_turn_context_includes_the_first():
    q = {"turns": ["ab", "cd"]}
    rec = _record([[5, 6, 5], [5, 6, 1]], [[1, 1], [1, 1]])
    cyc = C.cycle_records(rec, q, _prompt_ids)
    assert [(c["turn"], c["start"]) for c in cyc] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    # no 2-gram repeats within either turn's context (the fake prompt holds turn 0's answer as text only)
    assert [c["copy"] for c in cyc] == [False, False, False, False]


def test_cycle_records_rejects_inconsistent_records():
    q = {"turns": ["hello"]}
    with pytest.raises(ValueError, match="append"):
        C.cycle_records(_record([[1, 2, 3]], [[3, 3]]), q, _prompt_ids)
    bad = _record([[1, 2, 3]], [[1, 1]])
    del bad["choices"][0]["new_token_ids"]
    with pytest.raises(ValueError, match="new_token_ids"):
        C.cycle_records(bad, q, _prompt_ids)


@pytest.mark.parametrize("ids, accept, steps, match", [
    ([[1, 2, 3, 4, 5]], [0, 2, 2], [3], "integers >= 1"),
    ([[1, 2, 3, 4, 5]], [-1, 3, 2], [3], "integers >= 1"),
    ([[1, 2, 3], [4, 5, 6]], [1, 1, 1, 1], [4], "split"),        # one entry for two turns
    ([[1, 2, 3], [4, 5, 6]], [1, 1, 1, 1], [1, 2], "split")])    # 3 of 4 cycles
def test_cycle_records_rejects_bad_cycles(ids, accept, steps, match):
    rec = {"question_id": 1, "choices": [{"turns": ["x"] * len(ids), "new_token_ids": ids, "decoding_steps": steps,
                                          "accept_lengths": accept}]}
    with pytest.raises(ValueError, match=match):
        C.cycle_records(rec, {"turns": ["a", "b"]}, _prompt_ids)


def test_summary_numbers_by_hand():
    cyc = [{"a": 1, "copy": True}, {"a": 3, "copy": False}, {"a": 1, "copy": False}, {"a": 2, "copy": True}]
    res = C.summarize_cycles([("qa", cyc[:2]), ("rag", cyc[2:])])
    s = res["all"]
    assert s["cycles"] == 4 and s["tau"] == pytest.approx(7 / 4)
    assert s["tau_by_position"] == pytest.approx((1 + 9 + 1 + 4) / 7)
    assert s["p_no_draft"] == pytest.approx(0.5) and s["copy_share"] == pytest.approx(0.5)
    assert s["p_no_draft_copy"] == pytest.approx(0.5) and s["p_no_draft_other"] == pytest.approx(0.5)
    assert s["copy_share_of_failures"] == pytest.approx(0.5)
    assert res["groups"]["qa"]["tau"] == pytest.approx(2.0) and res["groups"]["rag"]["copy_share"] == pytest.approx(0.5)
    empty = C.summarize_cycles([("qa", [])])["all"]
    assert empty["tau"] is None and empty["cycles"] == 0
    assert "| all | 4 | 1.75 |" in C.render_cycles(res)


def test_answer_token_records_are_corpus_turns():
    q = {"turns": ["ab", "cd"]}
    rec = _record([[5, 6], [7]], [[1], [1]])
    out = C.answer_token_records([rec], {1: q}, _prompt_ids)
    assert out == [{"turns": [{"prompt_ids": _prompt_ids([{"role": "user", "content": "ab"}]), "answer_ids": [5, 6]}]},
                   {"turns": [{"prompt_ids": _prompt_ids([{"role": "user", "content": "ab"},
                                                          {"role": "assistant", "content": "xx"},
                                                          {"role": "user", "content": "cd"}]), "answer_ids": [7]}]}]


def test_main_fails_on_bad_flags_before_loading_anything(tmp_path, capsys):
    with pytest.raises(SystemExit):
        C.main(["--answers", str(tmp_path / "none.jsonl")])
    assert "--answers" in capsys.readouterr().err
    f = tmp_path / "a.jsonl.gz"
    with gzip.open(f, "wt") as fh:
        fh.write(json.dumps({**_record([[1, 2]], [[1]]), "category": "qa"}) + "\n")
    with pytest.raises(SystemExit):
        C.main(["--answers", str(f), "--question-file", str(tmp_path / "q.jsonl")])
    assert "--question-file" in capsys.readouterr().err
    (tmp_path / "q.jsonl").write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["ab"]}) + "\n")
    with pytest.raises(SystemExit):
        C.main(["--answers", str(f), "--question-file", str(tmp_path / "q.jsonl")])
    assert "prompt_format" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        C.main(["--answers", str(f), "--question-file", str(tmp_path / "q.jsonl"), "--heads", str(tmp_path)])
    assert "--heads" in capsys.readouterr().err
    q = str(tmp_path / "q.jsonl")
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit):
        C.main(["--answers", str(f), "--question-file", q, "--out", str(tmp_path / "file")])
    assert "--out" in capsys.readouterr().err
    base = {**_record([[1, 2]], [[1]]), "category": "qa", "prompt_format": {"name": "chat_template"}, "method": "rrsw"}
    for recs, says in (([base, {**base, "method": "univer", "question_id": 2}], "mixes"),
                       ([base, base], "more than once"),
                       ([{**base, "method": "naive"}], "plain decoding")):
        g = tmp_path / "b.jsonl"
        g.write_text("".join(json.dumps(r) + "\n" for r in recs))
        with pytest.raises(SystemExit):
            C.main(["--answers", str(g), "--question-file", q])
        assert says in capsys.readouterr().err


def test_score_heads_on_answers_counts_every_answer_position(tmp_path):
    """The heads' teacher-forced scores cover each answer token once (split into copy + other)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers

    from eagle.model.head import EagleHead, head_config_from_base

    vocab = {c: i for i, c in enumerate(["<pad>", "<unk>"] + list("abcdefgh "))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>")
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)
    torch.manual_seed(0)
    base = tmp_path / "base"
    LlamaForCausalLM(cfg).save_pretrained(base)
    tok.save_pretrained(base)
    head_dir = tmp_path / "head"
    EagleHead(head_config_from_base(cfg, bias=True), with_embeddings=False).save_pretrained(head_dir)
    from safetensors.torch import save_file
    save_file({"d2t": torch.tensor([3, 4, 5])}, str(head_dir / "draft_vocab.safetensors"))
    recs = [{"turns": [{"prompt_ids": [2, 3, 4, 5], "answer_ids": [3, 4, 5, 6, 3, 4, 5]}]},
            {"turns": [{"prompt_ids": [7, 8], "answer_ids": [9, 2, 9, 2, 9]}]}]
    sc = C.score_heads_on_answers([str(head_dir)], recs, base=str(base), depths=2, groups=["qa", "rag"])
    r = sc["heads"][str(head_dir)]
    assert sum(d["n"] for d in r["copy_by_distance"]) == r["copy"]["n_by_depth"][0]
    assert sum(v[p]["n"] for v in r["by_group"].values() for p in ("copy", "other")) == 12
    assert r["by_group"]["qa"]["copy"]["n"] + r["by_group"]["qa"]["other"]["n"] == 7  # its answer tokens
    assert "copy positions by how far back" in C._render_heads(sc)
    runs = r["copy_by_run"]   # the first three buckets split every copy position by run length
    assert sum(d["n"] for d in runs[:3]) == r["copy"]["n_by_depth"][0] and runs[3]["n"] <= runs[2]["n"]
    assert "continued the same copy" in C._render_heads(sc)
    dv = r["draft_vocab"]   # every position is inside or outside; the split follows the target's own top-1
    assert dv["k"] == 3 and dv["inside"]["n"] + dv["outside"]["n"] == 12 and "draft vocabulary" in C._render_heads(sc)
    save_file({"d2t": torch.arange(len(vocab))}, str(head_dir / "draft_vocab.safetensors"))    # every token inside
    dv = C.score_heads_on_answers([str(head_dir)], recs, base=str(base), depths=2)["heads"][str(head_dir)]["draft_vocab"]
    assert (dv["inside"]["n"], dv["outside"]["n"]) == (12, 0) and dv["inside"]["top1"] == r["top1_by_depth"][0]
    assert sc["sequences"] == 2 and sc["positions"] == 12 == r["n_by_depth"][0]
    assert r["copy"]["n_by_depth"][0] + r["other"]["n_by_depth"][0] == 12 and r["copy"]["n_by_depth"][0] > 0
    assert all(0.0 <= x <= 1.0 for x in r["top1_by_depth"] + r["top4_by_depth"])
    with pytest.raises(ValueError, match="depths"):
        C.score_heads_on_answers([str(head_dir)], recs, base=str(base), depths=1)
    with pytest.raises(ValueError, match="groups"):
        C.score_heads_on_answers([str(head_dir)], recs, base=str(base), groups=["qa"])


def test_copy_run_lengths():
    hits = torch.tensor([0, 1, 1, 1, 0, 1, 1, 1, 1], dtype=torch.bool)
    dist = torch.tensor([0, 5, 5, 5, 0, 9, 9, 3, 3])
    assert C.copy_run_lengths(hits, dist).tolist() == [0, 0, 1, 2, 0, 0, 1, 0, 1]  # a new distance starts a new run
    assert C.copy_run_lengths(hits[:0], dist[:0]).tolist() == []
    ids = torch.tensor([1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5])
    h, d = T.lookup_hits(ids, return_distance=True)
    assert C.copy_run_lengths(h, d).tolist()[-4:] == [0, 1, 2, 0]  # the repeat of 1 2 3 4 5, one copy run
