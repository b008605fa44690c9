"""Recall view of the corpus (eagle.train.recall, eagle.train.features --view recall)."""
from __future__ import annotations

import random

import pytest
import torch

from research import corpus as C
from eagle.train import features as Fe
from eagle.train import recall as R
from eagle.train.train import lookup_hits

from test_corpus import tiny  # noqa: F401  (fixture)
from test_train import tiny_base  # noqa: F401  (fixture)


def _rec(user: str, answer: str, answer_ids=None, uid="chat-1"):
    return {"uid": uid, "split": "train", "messages": [{"role": "user", "content": user},
                                                       {"role": "assistant", "content": answer}],
            "turns": [{"prompt_ids": [1, 2], "answer_ids": answer_ids or [7, 8, 9]}]}


def _contains(seq, sub) -> bool:
    n = len(sub)
    return any(list(seq[i:i + n]) == list(sub) for i in range(len(seq) - n + 1))


def _encoders(tok):
    return (lambda m: C._encode(tok, m)), (lambda s: tok.encode(s, add_special_tokens=False))


def test_sentence_spans():
    text = "  First one here now. Short. Second sentence has words!\nThird line goes on and on"
    spans = R.sentence_spans(text)
    assert [text[s:e] for s, e in spans] == ["First one here now.", "Second sentence has words!",
                                             "Third line goes on and on"]
    assert R.sentence_spans("") == [] and R.sentence_spans("a b c.") == []


def test_each_kind_copies_earlier_text_verbatim(tiny):
    _, tok, _ = tiny
    chat, text = _encoders(tok)
    user = "Read this. The cat sat on the warm mat today. A dog ran across the long road fast. Birds sang in the old tree."
    answer = "The answer starts here with words. Then a second sentence follows it. And a third one ends it all."
    rec = _rec(user, answer, answer_ids=text(answer) + [tok.eos_token_id])
    for kind in R.RECALL_KINDS:
        r = R.recall_record(rec, kind, random.Random(3), chat, text, tok.eos_token_id)
        assert r["kind"] == f"recall-{kind}" and r["split"] == "train" and r["uid"] == f"chat-1#recall-{kind}"
        t = r["turns"][0]
        copy = t["answer_ids"][:-1]
        assert t["answer_ids"][-1] == tok.eos_token_id and copy
        source = text(answer) if kind != "quote" else text(user)
        assert _contains(source, copy), kind                 # a verbatim piece of the earlier text
        assert _contains(t["prompt_ids"], text(user)) and _contains(t["prompt_ids"], text(answer))
        if kind != "repeat":   # the ask quotes the copy's first words
            lead = " ".join(tok.decode(copy).replace("  ", "\0").replace(" ", "").replace("\0", " ").split()[:5])
            assert _contains(t["prompt_ids"][-len(text(lead)) - 40:], text(lead)), kind
        ids = torch.tensor(t["prompt_ids"] + t["answer_ids"])
        hits = lookup_hits(ids, ngram=8)[len(t["prompt_ids"]) + 8:-2]  # char tokens: match 8
        assert hits.float().mean() > 0.8  # the answer continues n-grams of the context almost everywhere
    assert R.recall_record(rec, "repeat", random.Random(0), chat, text, 2)["turns"][0]["answer_ids"] == \
        rec["turns"][0]["answer_ids"]  # repeat: the original answer's own ids


def test_kinds_that_do_not_apply_and_bad_kind(tiny):
    _, tok, _ = tiny
    chat, text = _encoders(tok)
    rec = _rec("One short sentence only here.", "Single sentence answer right here.")
    assert R.recall_record(rec, "quote", random.Random(0), chat, text, 2) is None   # < 2 sentences to quote
    assert R.recall_record(rec, "resume", random.Random(0), chat, text, 2) is None  # no later sentence
    assert R.recall_record(rec, "repeat", random.Random(0), chat, text, 2) is not None
    assert R.recall_record(_rec("x y z w.", "  "), "repeat", random.Random(0), chat, text, 2) is None
    for broken in ({"uid": "a"}, {"messages": [], "turns": []}, {**rec, "messages": rec["messages"][:1]}):
        assert R.recall_record(broken, "repeat", random.Random(0), chat, text, 2) is None   # nothing to copy
    with pytest.raises(ValueError, match="recall kind"):
        R.recall_record(rec, "paraphrase", random.Random(0), chat, text, 2)


def test_recall_records_deterministic_and_within_max_len(tiny):
    _, tok, _ = tiny
    recs = [_rec(f"Question {i} has this first sentence. And it has a second sentence too.",
                 f"Answer {i} is this sentence here. It has another sentence after it. " * (1 + i % 3),
                 uid=f"chat-{i}") for i in range(12)]
    a = R.recall_records(recs, tok, seed=0, max_len=10_000)
    assert len(a) == 12 and a == R.recall_records(recs, tok, seed=0, max_len=10_000)
    assert {r["kind"] for r in a} == {f"recall-{k}" for k in R.RECALL_KINDS}   # every kind is used
    assert R.recall_records(recs, tok, seed=1, max_len=10_000) != a             # the seed changes the choices
    lens = [len(r["turns"][0]["prompt_ids"]) + len(r["turns"][0]["answer_ids"]) for r in a]
    cut = sorted(lens)[6]
    kept = R.recall_records(recs, tok, seed=0, max_len=cut)
    assert 0 < len(kept) < 12   # longer ones are left out, never cut
    assert all(len(r["turns"][0]["prompt_ids"]) + len(r["turns"][0]["answer_ids"]) <= cut for r in kept)


def test_features_cli_recall_view(tiny, tmp_path, capsys):
    """--view recall writes the recall sequences' features, marks them, and refuses to mix views in one --out."""
    model, tok, folder = tiny
    (tmp_path / "corpus" / "run").mkdir(parents=True)
    for k in range(2):   # corpus shards with real text (the tiny random model answers only blanks)
        recs = [_rec(f"Question {k} {i} has a first sentence. And it has a second sentence too.",
                     f"Answer {i} is this sentence here. It has another sentence after it.", uid=f"chat-{k}-{i}")
                for i in range(3)]
        for r in recs:
            r["turns"][0]["answer_ids"] = tok.encode(r["messages"][1]["content"], add_special_tokens=False)
        recs[2]["split"] = "heldout"
        C.write_shard(tmp_path / "corpus" / "run" / f"shard_{k:05d}.jsonl.gz", recs)
    common = ["--corpus", str(tmp_path / "corpus"), "--base", str(folder), "--threads", "1", "--fast-cpu", "off",
              "--max-len", "2000"]
    s = Fe.main(common + ["--out", str(tmp_path / "rec"), "--view", "recall"])
    assert s["feature_shards_written"] == 4   # 2 corpus shards x (train, heldout)
    import gzip
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file

    written = sorted((tmp_path / "rec").rglob("*.safetensors"))
    assert written
    for p in written:
        with safe_open(str(p), "pt") as f:
            assert f.metadata()["view"] == "recall"
        t = load_file(str(p))
        src = tmp_path / "corpus" / "run" / f"shard_{p.stem.split('_')[-1]}.jsonl.gz"
        with gzip.open(src, "rt") as f:
            part = [r for r in map(json.loads, f) if r["split"] == p.parent.name]
        want = [s for r in R.recall_records(part, tok, 0, 2000) for s in Fe.sequences_of(r, 2000)]
        assert t["offsets"].numel() - 1 == len(want) >= 1
        assert t["input_ids"].tolist() == [x for ids, _ in want for x in ids]
        assert t["loss_mask"].tolist() == [m for _, ms in want for m in ms]
    assert Fe.main(common + ["--out", str(tmp_path / "rec"), "--view", "recall"])["feature_shards_written"] == 0
    with pytest.raises(SystemExit):
        Fe.main(common + ["--out", str(tmp_path / "rec")])   # the answers view into a recall folder
    assert "--view" in capsys.readouterr().err
    again = Fe.main(common + ["--out", str(tmp_path / "rec"), "--view", "recall", "--recall-seed", "7"])
    assert again["feature_shards_written"] == 4   # another seed: other choices, redone
    (tmp_path / "afile").write_text("")
    for bad, why in ((["--out", str(tmp_path / "afile")], "is a file"),
                     (["--out", str(tmp_path / "x"), "--max-len", "2"], "--max-len must be")):
        with pytest.raises(SystemExit):
            Fe.main(common + bad + ["--view", "recall"])
        assert why in capsys.readouterr().err
    # records with nothing to copy: one clear stop, not an empty folder and exit 0
    (tmp_path / "blank" / "run").mkdir(parents=True)
    C.write_shard(tmp_path / "blank" / "run" / "shard_00000.jsonl.gz", [_rec("Only a question here.", " ")])
    with pytest.raises(SystemExit, match="no record"):
        Fe.main(common + ["--corpus", str(tmp_path / "blank"), "--out", str(tmp_path / "b"), "--view", "recall"])


def test_target_top1():
    from research.heldout import target_top1

    w = torch.eye(5)                      # lm_head: hidden one-hot -> that token
    ids = torch.tensor([0, 3, 1, 4])
    hidden = torch.stack([w[3], w[1], w[2], w[0]])   # predicts 3, 1 (right), then 2 (wrong: 4)
    seq = {"ids": ids, "mask": torch.tensor([0, 1, 1, 1], dtype=torch.bool), "hidden": hidden.half()}
    assert target_top1([seq], w) == pytest.approx(2 / 3)
    assert target_top1([], w) == 0.0


def test_heldout_cli_recall_view(tiny, tmp_path):
    """research.heldout --view recall scores heads on the held-out records' recall sequences."""
    from eagle.model.head import EagleHead, head_config_from_base
    from research import heldout as Ho

    model, tok, folder = tiny
    (tmp_path / "corpus").mkdir()
    recs = [_rec(f"Question {i} has a first sentence. And it has a second sentence too.",
                 f"Answer {i} is this sentence here. It has another sentence after it.", uid=f"chat-{i}")
            for i in range(3)]
    for r in recs:
        r["split"], r["temperature"] = "heldout", 0.0
        r["turns"][0]["answer_ids"] = tok.encode(r["messages"][1]["content"], add_special_tokens=False)
    C.write_shard(tmp_path / "corpus" / "shard_00000.jsonl.gz", recs)
    EagleHead(head_config_from_base(model.config), with_embeddings=False).save_pretrained(tmp_path / "head")
    common = ["--heads", str(tmp_path / "head"), "--corpus", str(tmp_path / "corpus"), "--base", str(folder),
              "--depths", "2", "--threads", "1"]
    a = Ho.main(common)
    r = Ho.main(common + ["--view", "recall"])
    assert (a["view"], r["view"]) == ("answers", "recall")
    assert r["sequences"] == len(R.recall_records(recs, tok, 0, Fe.DEFAULT_MAX_LEN)) == 3
    assert r["positions"] > 0 and 0.0 <= r["target_top1"] <= 1.0
    with pytest.raises(SystemExit):
        Ho.main(common + ["--view", "paraphrase"])
    blank = tmp_path / "blank"
    blank.mkdir()
    C.write_shard(blank / "shard_00000.jsonl.gz", [{**recs[0], "messages": recs[0]["messages"][:1]}])
    for corpus in (blank, tmp_path / "missing"):   # nothing to score / no folder: one line, no table of zeros
        with pytest.raises(SystemExit):
            Ho.main(common[:2] + ["--corpus", str(corpus)] + common[4:] + ["--view", "recall"])


def test_heldout_cli_by_kind_splits_positions_by_record_kind(tiny, tmp_path):
    """--by-kind scores each record kind on its own; the kinds' positions add up to the whole set and their
    position-weighted top-1 is the pooled one."""
    from eagle.model.head import EagleHead, head_config_from_base
    from research import heldout as Ho

    model, tok, folder = tiny
    (tmp_path / "corpus").mkdir()
    recs = []
    for i, kind in enumerate(["chat", "math", "chat", "translation"]):
        r = _rec(f"Question {i} asks something here.", f"Answer {i} says this and then that, twice over.",
                 uid=f"{kind}-{i}")
        r["split"], r["temperature"], r["kind"] = "heldout", 0.0, kind
        r["turns"][0]["answer_ids"] = tok.encode(r["messages"][1]["content"], add_special_tokens=False)
        recs.append(r)
    C.write_shard(tmp_path / "corpus" / "shard_00000.jsonl.gz", recs)
    torch.manual_seed(0)
    EagleHead(head_config_from_base(model.config), with_embeddings=False).save_pretrained(tmp_path / "head")
    h = str(tmp_path / "head")
    res = Ho.main(["--heads", h, "--corpus", str(tmp_path / "corpus"), "--base", str(folder), "--depths", "2",
                   "--threads", "1", "--by-kind"])["heads"][h]
    assert set(res["by_kind"]) == {"chat", "math", "translation"}
    torch.manual_seed(1)
    EagleHead(head_config_from_base(model.config), with_embeddings=False).save_pretrained(tmp_path / "head2")
    two = Ho.main(["--heads", f"{h},{tmp_path / 'head2'}", "--corpus", str(tmp_path / "corpus"), "--base", str(folder),
                   "--depths", "2", "--threads", "1"])
    p = two["paired"]["heads"][str(tmp_path / "head2")]
    assert two["paired"]["reference"] == h and len(p["top1_se_by_depth"]) == 2
    for d in range(2):
        diff = two["heads"][str(tmp_path / "head2")]["top1_by_depth"][d] - two["heads"][h]["top1_by_depth"][d]
        assert p["top1_diff_by_depth"][d] == pytest.approx(diff, abs=2e-4)
    for d in range(2):
        n = [v["n_by_depth"][d] for v in res["by_kind"].values()]
        assert sum(n) == res["n_by_depth"][d]
        pooled = sum(v["top1_by_depth"][d] * v["n_by_depth"][d] for v in res["by_kind"].values()) / sum(n)
        assert pooled == pytest.approx(res["top1_by_depth"][d], abs=1e-3)
