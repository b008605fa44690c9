"""Fast CPU tests of the head-training pipeline on a tiny random Llama (eagle.train.data / .train)."""
from __future__ import annotations

import json
import os
import string
from pathlib import Path

import pytest
import torch

from eagle.train import data as D
from eagle.train import train as T

SPECBENCH_TURNS = [
    "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences.",
    "Summarize the following article about the economy of small island nations in three sentences please.",
]


def _tiny_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<bos>", "<eos>"]
    chars = list(string.ascii_lowercase + string.ascii_uppercase + string.digits + " .,?!:\n'-")
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>", bos_token="<bos>",
                                  eos_token="<eos>")
    tok.chat_template = ("{% for m in messages %}<bos>{{ m['role'] }}:\n{{ m['content'] }}<eos>\n{% endfor %}"
                         "{% if add_generation_prompt %}<bos>assistant:\n{% endif %}")
    return tok


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    """A tiny random Llama (hidden 32, 2 layers, vocab 80) + char tokenizer with a chat template."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny_base")
    tok = _tiny_tokenizer()
    cfg = LlamaConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, pad_token_id=0, bos_token_id=2, eos_token_id=3)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inputs")
    recs = [{"instruction": f"Write item number {i} of a short list.", "input": "" if i % 2 else f"Topic {i}",
             "output": f"Item {i}: a plain answer."} for i in range(12)]
    # planted Spec-Bench overlaps: exact, containing, 8-gram shared
    recs.append({"instruction": SPECBENCH_TURNS[0], "input": "", "output": "x"})
    recs.append({"instruction": "Please do this: " + SPECBENCH_TURNS[0].upper(), "input": "", "output": "y"})
    recs.append({"instruction": "Can you summarize the following article about the economy of small island "
                                "states today?", "input": "", "output": "z"})
    prompts = folder / "prompts.json"
    prompts.write_text(json.dumps(recs))
    sb = folder / "question.jsonl"
    sb.write_text("\n".join(json.dumps({"question_id": i, "category": "x", "turns": [t]})
                            for i, t in enumerate(SPECBENCH_TURNS)) + "\n")
    return prompts, sb


def _data_args(base, out, prompts, sb, seed=0):
    return ["--base", str(base), "--out", str(out), "--prompts", str(prompts), "--specbench", str(sb),
            "--n-gen", "4", "--n-fixed", "100", "--shard-size", "2", "--gen-batch", "2",
            "--fixed-shard-size", "4", "--fixed-per-gen", "1", "--max-new", "6", "--sample-every", "2",
            "--seed", str(seed), "--threads", "1"]


@pytest.fixture(scope="module")
def tiny_data(tiny_base, tiny_inputs, tmp_path_factory):
    prompts, sb = tiny_inputs
    out = tmp_path_factory.mktemp("data")
    summary = D.main(_data_args(tiny_base, out, prompts, sb))
    return out, summary


def test_dedupe_removes_planted_specbench(tiny_inputs):
    prompts, sb = tiny_inputs
    kept, stats = D.dedupe_against_specbench(D.load_alpaca(prompts), sb, ngram=8)
    assert stats["before"] == 15 and stats["after"] == 12
    assert stats["dropped_exact_or_contained"] == 2 and stats["dropped_ngram"] == 1
    assert all("hawaii" not in r["prompt"].lower() and "island" not in r["prompt"].lower() for r in kept)


def test_dedupe_real_specbench_question():
    from pathlib import Path

    if not Path(D.DEFAULT_SPECBENCH).exists():
        pytest.skip(f"{D.DEFAULT_SPECBENCH} absent")
    first = json.loads(open(D.DEFAULT_SPECBENCH).readline())["turns"][0]
    recs = [{"id": 0, "prompt": "  " + first.upper() + "  ", "output": ""},
            {"id": 1, "prompt": "Name three primary colours.", "output": "Red, yellow and blue."}]
    kept, _ = D.dedupe_against_specbench(recs, D.DEFAULT_SPECBENCH)
    assert [r["id"] for r in kept] == [1]


def test_data_shards_shapes_masks_and_hidden(tiny_base, tiny_data):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out, summary = tiny_data
    assert summary["dedupe"]["after"] == 12
    files = sorted(out.glob("shard_*.safetensors"))
    kinds = [json.load(open(f.with_suffix(".json")))["kind"] for f in files]
    assert kinds == ["fixed", "greedy", "fixed", "sample"] + ["fixed"] * (len(files) - 4)
    assert summary["sequences"] == 12
    model = AutoModelForCausalLM.from_pretrained(str(tiny_base), dtype=torch.float32).eval()
    for f in files:
        sh = load_file(str(f))
        T_ = sh["input_ids"].shape[0]
        assert sh["input_ids"].dtype == torch.int32 and sh["loss_mask"].dtype == torch.uint8
        assert sh["hidden"].dtype == torch.float16 and sh["hidden"].shape == (T_, 32)
        off = sh["offsets"].tolist()
        assert off[0] == 0 and off[-1] == T_
        for a, b in zip(off[:-1], off[1:]):
            m = sh["loss_mask"][a:b].tolist()
            first = m.index(1)                          # prompt zeros, then response ones
            assert first > 0 and all(v == 0 for v in m[:first]) and all(v == 1 for v in m[first:])
        a, b = off[0], off[1]
        with torch.no_grad():
            ref = model.model(sh["input_ids"][a:b].long()[None]).last_hidden_state[0]
        torch.testing.assert_close(sh["hidden"][a:b].float(), ref, atol=2e-2, rtol=1e-2)


def test_load_sequences_reads_feature_rows_from_disk_as_the_shard_holds_them(tiny_data, tmp_path):
    from safetensors.torch import load_file, save_file

    from eagle.train.data import FeatureRows, feature_rows, shard_paths

    out, _ = tiny_data
    seqs = T.load_sequences(out, max_len=200)
    assert seqs and all(isinstance(s["hidden"], FeatureRows) for s in seqs)
    i = 0
    for path in shard_paths(out):                      # same sequences, same rows as the in-memory shard
        sh = load_file(str(path))
        off = sh["offsets"].tolist()
        for a, b in zip(off[:-1], off[1:]):
            b = min(b, a + 200)
            if b - a < 3 or not sh["loss_mask"][a + 1:b].bool().any():
                continue
            s = seqs[i]
            i += 1
            assert s["hidden"].shape == (b - a, 32) and len(s["hidden"]) == b - a
            assert torch.equal(s["hidden"].load(), sh["hidden"][a:b])
            assert torch.equal(s["hidden"].float(), sh["hidden"][a:b].float())
            assert torch.equal(s["hidden"][1:3], sh["hidden"][a + 1:a + 3])
            assert torch.equal(s["ids"], sh["input_ids"][a:b].long())
    assert i == len(seqs)
    ids, hid, mask = T.collate(seqs, [0, 1])
    assert hid.dtype == torch.float32 and torch.equal(hid[1, :len(seqs[1]["ids"])], seqs[1]["hidden"].float())
    r = feature_rows(shard_paths(out)[0]).rows(2, 5)
    assert len(r) == 3 and len(r.rows(1, 99)) == 2 and len(r.rows(5, 1)) == 0
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file at all")
    with pytest.raises(ValueError, match="no readable 2-D"):
        feature_rows(bad)
    save_file({"hidden": torch.zeros(4, 3, dtype=torch.int32)}, str(bad))
    with pytest.raises(ValueError, match="F16/BF16/F32"):
        feature_rows(bad)
    cut = tmp_path / "cut.safetensors"                  # a shard cut short after the run started
    save_file({"hidden": torch.ones(4, 3, dtype=torch.float16)}, str(cut))
    rows = feature_rows(cut)
    cut.write_bytes(cut.read_bytes()[:-8])
    with pytest.raises(OSError, match="cut short"):
        rows.load()


def test_data_resumable_and_deterministic(tiny_base, tiny_inputs, tiny_data, tmp_path):
    from safetensors.torch import load_file

    prompts, sb = tiny_inputs
    out, _ = tiny_data
    again = D.main(_data_args(tiny_base, out, prompts, sb))
    assert again["shards_written_now"] == 0 and again["shards_skipped"] == again["planned"]
    other = tmp_path / "d2"
    D.main(_data_args(tiny_base, other, prompts, sb))
    # delete one shard: a rerun rewrites only that one
    (other / "shard_00001.safetensors").unlink()
    third = D.main(_data_args(tiny_base, other, prompts, sb))
    assert third["shards_written_now"] == 1
    for f in sorted(out.glob("shard_*.safetensors")):
        x, y = load_file(str(f)), load_file(str(other / f.name))
        for k in x:
            assert torch.equal(x[k], y[k]), (f.name, k)


def test_train_reduces_loss_and_saves_loadable_head(tiny_base, tiny_data, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from eagle.model.head import EagleHead

    data, _ = tiny_data
    out = tmp_path / "head"
    log = T.main(["--base", str(tiny_base), "--data", str(data), "--out", str(out), "--max-steps", "40",
                  "--lr", "3e-3", "--warmup", "2", "--batch-tokens", "256", "--val-frac", "0.2",
                  "--log-every", "5", "--eval-at-start", "--noise", "0.05", "--threads", "1"])
    hist = log["history"]
    assert log["steps"] == 40 and len(hist) == 8
    assert hist[-1]["loss"] < 0.8 * hist[0]["loss"]
    assert log["eval"][-1]["loss"] < log["eval"][0]["loss"]
    assert 0.0 <= log["eval"][-1]["acc"] <= 1.0
    state = load_file(str(out / "model.safetensors"))
    assert "embed_tokens.weight" not in state and state["fc.weight"].dtype == torch.float16
    assert state["fc.weight"].shape == (32, 64)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_base), dtype=torch.float32)
    head = EagleHead.from_pretrained(out, embedding=base.get_input_embeddings())
    y = head(torch.tensor([[5, 6, 7]]), torch.randn(1, 3, 32))
    assert y.shape == (1, 3, 32)
    saved = json.load(open(out / "train_log.json"))
    assert saved["steps"] == 40 and saved["peak_rss_gib"] > 0


def test_alignment_loss_uses_next_feature():
    """A head that outputs exactly f_{t+1} gets zero regression loss and top-1 = 1."""
    torch.manual_seed(0)
    B, L, H, V = 2, 6, 8, 11
    hid = torch.randn(B, L, H)
    ids = torch.randint(0, V, (B, L))
    mask = torch.zeros(B, L, dtype=torch.bool)
    mask[:, 3:] = True

    class Oracle(torch.nn.Module):
        def forward(self, input_ids, features):
            assert torch.equal(input_ids, ids[:, 1:]) and torch.equal(features, hid[:, :-1])
            return hid[:, 1:].clone().requires_grad_(True)

    loss, st = T.eagle_loss(Oracle(), torch.randn(V, H), ids, hid, mask, noise=0.0)
    assert st["reg"] == 0.0 and st["acc"] == 1.0 and st["n"] == B * 3  # t = 2..4: x_{t+1} is a response token


def test_data_partial_kinds_fill_the_same_plan(tiny_base, tiny_inputs, tiny_data, tmp_path):
    """--kinds / --first-shards build a subset of the same plan; a later run fills in identical shards."""
    from safetensors.torch import load_file

    prompts, sb = tiny_inputs
    out, _ = tiny_data
    part = tmp_path / "part"
    s1 = D.main(_data_args(tiny_base, part, prompts, sb) + ["--kinds", "fixed", "--first-shards", "2"])
    assert s1["shards_written_now"] == 1 and s1["shards_total"] == 1          # shard 0 (fixed) only
    s2 = D.main(_data_args(tiny_base, part, prompts, sb) + ["--kinds", "greedy", "--first-shards", "2"])
    assert s2["shards_written_now"] == 1 and s2["shards_total"] == 2          # + shard 1 (greedy)
    for name in ("shard_00000.safetensors", "shard_00001.safetensors"):
        x, y = load_file(str(out / name)), load_file(str(part / name))
        assert all(torch.equal(x[k], y[k]) for k in x)


def test_data_workers_split_the_plan(tiny_base, tiny_inputs, tiny_data, tmp_path):
    """Two --worker I/2 runs into one folder build disjoint shards identical to a one-process run."""
    from safetensors.torch import load_file

    prompts, sb = tiny_inputs
    out, full = tiny_data
    split = tmp_path / "split"
    a = D.main(_data_args(tiny_base, split, prompts, sb) + ["--worker", "0/2"])
    b = D.main(_data_args(tiny_base, split, prompts, sb) + ["--worker", "1/2"])
    assert a["shards_written_now"] + b["shards_written_now"] == full["shards_total"] == b["shards_total"]
    assert a["shards_written_now"] > 0 and b["shards_written_now"] > 0
    for p in sorted(out.glob("shard_*.safetensors")):
        x, y = load_file(str(p)), load_file(str(split / p.name))
        assert all(torch.equal(x[k], y[k]) for k in x)
    with pytest.raises(SystemExit):
        D.main(_data_args(tiny_base, tmp_path / "bad", prompts, sb) + ["--worker", "2/2"])


def test_data_exclude_gen_of_earlier_run(tiny_base, tiny_inputs, tiny_data, tmp_path):
    """--exclude-gen-of DIR: the new plan answers none of the prompts DIR's plan answers itself."""
    prompts, sb = tiny_inputs
    first, _ = tiny_data
    args = json.load(open(first / "plan.json"))["args"]
    recs, _ = D.dedupe_against_specbench(D.load_alpaca(prompts), sb, 8)
    earlier = {r["id"] for p in D.plan_shards(recs, args["n_gen"], 0, args["shard_size"], args["seed"])
               for r in p["records"]}
    second = tmp_path / "second"
    s = D.main(_data_args(tiny_base, second, prompts, sb, seed=1) + ["--exclude-gen-of", str(first), "--kinds", "x"])
    assert s["dedupe"]["excluded_gen_of_earlier_run"] == len(earlier) == args["n_gen"]


def test_train_several_folders_val_data_and_init(tiny_base, tiny_inputs, tiny_data, tmp_path):
    """--data A,B --val-data B holds out only B's sequences; --init starts from a saved head."""
    from eagle.model.head import EagleHead

    prompts, sb = tiny_inputs
    a, _ = tiny_data
    b = tmp_path / "b"
    D.main(_data_args(tiny_base, b, prompts, sb, seed=3))
    common = ["--base", str(tiny_base), "--batch-tokens", "256", "--threads", "1", "--warmup", "1",
              "--lr", "3e-3", "--val-frac", "0.5", "--eval-at-start"]
    h1 = tmp_path / "h1"
    T.main(common + ["--data", str(a), "--out", str(h1), "--max-steps", "30"])
    h2 = tmp_path / "h2"
    log = T.main(common + ["--data", f"{a},{b}", "--val-data", str(b), "--out", str(h2), "--max-steps", "1",
                           "--init", str(h1), "--lr", "1e-9"])
    n_a, n_b = len(T.load_sequences(a)), len(T.load_sequences(b))
    assert log["val_sequences"] == round(0.5 * n_b) and log["train_sequences"] == n_a + n_b - log["val_sequences"]
    # the warm start is h1 itself: its held-out loss at step 0 equals h1's loss on that set
    ref = T.main(common + ["--data", f"{a},{b}", "--val-data", str(b), "--out", str(tmp_path / "h3"),
                           "--max-steps", "1", "--lr", "1e-9"])
    assert log["eval"][0]["loss"] < ref["eval"][0]["loss"]
    emb = torch.nn.Embedding(80, 32)  # fc weights do not depend on it
    w1 = EagleHead.from_pretrained(h1, embedding=emb).fc.weight
    w2 = EagleHead.from_pretrained(h2, embedding=emb).fc.weight
    assert torch.allclose(w1.float(), w2.float(), atol=1e-3)
    # exclusive: B's sequences beyond the drawn held-out ones are not trained on either
    ex = T.main(common + ["--data", f"{a},{b}", "--val-data", str(b), "--val-data-exclusive", "--out",
                          str(tmp_path / "h5"), "--max-steps", "1", "--lr", "1e-9"])
    assert ex["val_sequences"] == log["val_sequences"] and ex["train_sequences"] == n_a
    with pytest.raises(ValueError, match="val-data"):
        T.main(common + ["--data", str(a), "--val-data", str(b), "--out", str(tmp_path / "h4"), "--max-steps", "1"])


def test_data_exclude_gen_of_a_worker_folder(tiny_base, tiny_inputs, tmp_path):
    """A folder filled by --worker runs (plan.workerI.json only) works with --exclude-gen-of; no plan -> error."""
    prompts, sb = tiny_inputs
    first = tmp_path / "w"
    D.main(_data_args(tiny_base, first, prompts, sb) + ["--worker", "0/2", "--kinds", "x"])
    assert not (first / "plan.json").exists() and (first / "plan.worker0.json").exists()
    s = D.main(_data_args(tiny_base, tmp_path / "second", prompts, sb, seed=1)
               + ["--exclude-gen-of", str(first), "--kinds", "x"])
    assert s["dedupe"]["excluded_gen_of_earlier_run"] == 4
    with pytest.raises(FileNotFoundError, match="no plan.json"):
        D.main(_data_args(tiny_base, tmp_path / "third", prompts, sb) + ["--exclude-gen-of", str(tmp_path / "none")])


def test_distribution_terms_on_draft_vocab_rows_are_the_renormalised_laws():
    """With the draft vocabulary's rows, both laws are softmaxes over those rows (target renormalised)."""
    g = torch.Generator().manual_seed(0)
    W = torch.randn(50, 8, generator=g)
    p, tgt = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    d2t = torch.tensor([1, 4, 7, 9, 20, 33, 49])
    ce, rej, acc, top2 = T._distribution_terms(p, tgt, W[d2t], 1.0, None, top_k=2)
    t_full = torch.softmax(tgt @ W.T, -1)[:, d2t]
    t_k = t_full / t_full.sum(-1, keepdim=True)
    q_k = torch.softmax(p @ W[d2t].T, -1)
    assert torch.allclose(ce, -(t_k * q_k.log()).sum(-1).mean(), atol=1e-5)
    assert torch.allclose(rej, 1 - torch.minimum(t_k, q_k).sum(-1).mean(), atol=1e-6)
    assert acc.dtype == torch.bool and acc.shape == (6,)
    assert torch.equal(acc, q_k.argmax(-1) == t_k.argmax(-1))
    top = q_k.topk(2, -1).indices
    assert torch.equal(top2, (top == t_k.argmax(-1)[:, None]).any(-1))


def test_train_with_draft_vocab_copies_it_beside_the_head(tiny_base, tiny_data, tmp_path):
    from eagle.train.draft_vocab import load_draft_vocab, save_draft_vocab

    a, _ = tiny_data
    dv = tmp_path / "dv"
    save_draft_vocab(dv, torch.arange(0, 80, 2))
    out = tmp_path / "h"
    log = T.main(["--base", str(tiny_base), "--data", str(a), "--out", str(out), "--batch-tokens", "256",
                  "--threads", "1", "--max-steps", "2", "--draft-vocab", str(dv), "--unroll", "2"])
    assert log["steps"] == 2
    assert torch.equal(load_draft_vocab(out), torch.arange(0, 80, 2))
    for bad in (tmp_path / "nowhere", tmp_path / "junk.safetensors"):
        (tmp_path / "junk.safetensors").write_bytes(b"not safetensors")
        with pytest.raises(ValueError, match="draft-vocab"):
            T.main(["--base", str(tiny_base), "--data", str(a), "--out", str(tmp_path / "h2"), "--max-steps", "1",
                    "--draft-vocab", str(bad)])
    save_draft_vocab(tmp_path / "unsorted", torch.arange(0, 80, 2))
    from safetensors.torch import save_file

    save_file({"d2t": torch.tensor([5, 3, 9])}, str(tmp_path / "unsorted" / "draft_vocab.safetensors"))
    with pytest.raises(ValueError, match="strictly increasing"):
        T.main(["--base", str(tiny_base), "--data", str(a), "--out", str(tmp_path / "h3"), "--max-steps", "1",
                "--draft-vocab", str(tmp_path / "unsorted")])
    # --val-data-exclusive needs --val-data and something left to train on
    with pytest.raises(ValueError, match="needs --val-data"):
        T.main(["--base", str(tiny_base), "--data", str(a), "--out", str(tmp_path / "h4"), "--max-steps", "1",
                "--val-data-exclusive"])
    with pytest.raises(ValueError, match="no training sequences"):
        T.main(["--base", str(tiny_base), "--data", str(a), "--val-data", str(a), "--out", str(tmp_path / "h4"),
                "--max-steps", "1", "--val-data-exclusive"])


def _lookup_hits_naive(ids: list[int], n: int) -> list[bool]:
    out = [False] * len(ids)
    for i in range(n - 1, len(ids) - 1):
        suffix = ids[i - n + 1:i + 1]
        for k in range(i - 1, n - 2, -1):  # most recent earlier occurrence ending at k < i
            if ids[k - n + 1:k + 1] == suffix:
                out[i] = ids[k + 1] == ids[i + 1]
                break
    return out


@pytest.mark.parametrize("n", [1, 2, 3])
def test_lookup_hits_equals_the_naive_prompt_lookup_rule(n):
    g = torch.Generator().manual_seed(n)
    ids = torch.randint(0, 4, (3, 40), generator=g)  # small vocabulary: many repeats, hits and misses
    got = T.lookup_hits(ids, n)
    assert got.shape == ids.shape and got.dtype == torch.bool
    for b in range(3):
        assert got[b].tolist() == _lookup_hits_naive(ids[b].tolist(), n)
    assert torch.equal(T.lookup_hits(ids[1], n), got[1])
    assert got.any() and not got.all()


def test_lookup_hits_marks_a_copied_phrase():
    #          0  1  2  3  4  5  6  7  8  9
    ids = torch.tensor([5, 6, 7, 8, 1, 2, 6, 7, 8, 3])
    # at i=7 the 2-gram (6, 7) occurred at 1..2, followed by 8 == ids[8]: a copy; at i=8 (7, 8) -> 1 != 3
    assert T.lookup_hits(ids).tolist() == [False] * 7 + [True, False, False]
    hits, dist = T.lookup_hits(ids, return_distance=True)
    assert hits.tolist() == T.lookup_hits(ids).tolist()
    assert dist[7] == 5 and dist[8] == 5 and dist[0] == 0  # (6, 7) ends at 2 and 7; (7, 8) at 3 and 8
    with pytest.raises(ValueError, match="ngram"):
        T.lookup_hits(ids, 0)
    empty = torch.zeros(0, dtype=torch.long)
    assert T.lookup_hits(empty).shape == (0,) and T.lookup_hits(empty[None], return_distance=True)[1].shape == (1, 0)
    with pytest.raises(ValueError, match="shape"):
        T.lookup_hits(ids[None, None])


def _tiny_head_batch(seed=0, B=2, L=12, H=16, V=30):
    from eagle.model.head import EagleHead
    from transformers import LlamaConfig

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=32, num_attention_heads=2, num_key_value_heads=2,
                      num_hidden_layers=1, max_position_embeddings=64)
    hcfg = T.head_config_from_base(cfg, bias=True)
    hcfg._attn_implementation = "sdpa"  # as train() sets it
    head = EagleHead(hcfg, with_embeddings=True)
    ids = torch.randint(0, 5, (B, L))
    hid = torch.randn(B, L, H)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[:, :3] = False
    return head, torch.randn(V, H), ids, hid, mask


def test_copy_weight_one_is_the_plain_loss_and_all_copy_rows_change_nothing():
    head, W, ids, hid, mask = _tiny_head_batch()
    base, st0 = T.unrolled_loss(head, W, ids, hid, mask, steps=2)
    copy = T.lookup_hits(ids)
    same, st1 = T.unrolled_loss(head, W, ids, hid, mask, steps=2, copy=copy, copy_weight=1.0)
    assert torch.allclose(base, same) and st0["acc_by_depth"] == st1["acc_by_depth"]
    every, _ = T.unrolled_loss(head, W, ids, hid, mask, steps=2, copy=torch.ones_like(copy), copy_weight=5.0)
    assert torch.allclose(base, every, atol=1e-6)  # a weighted mean with equal weights
    with pytest.raises(ValueError, match="copy_weight"):
        T.unrolled_loss(head, W, ids, hid, mask, steps=2, copy_weight=2.0)
    for bad in (0.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="copy_weight"):
            T.unrolled_loss(head, W, ids, hid, mask, steps=2, copy=copy, copy_weight=bad)


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf"])
def test_copy_weight_flag_is_checked_before_any_work(bad, tmp_path, capsys):
    with pytest.raises(SystemExit):
        T.main(["--data", str(tmp_path / "none"), "--out", str(tmp_path / "o"), "--copy-weight", bad])
    assert "--copy-weight" in capsys.readouterr().err


def test_copy_weight_is_a_weighted_mean_over_rows():
    """Weight w on one row equals that row repeated w times (w integer), for every term of depth 1."""
    head, W, ids, hid, mask = _tiny_head_batch(seed=1, B=1)
    copy = torch.zeros_like(mask)
    copy[0, 6] = True                       # loss row of head position 5
    weighted, _ = T.unrolled_loss(head, W, ids, hid, mask, steps=1, copy=copy, copy_weight=3.0, w_tv=0.5)
    # by hand: per-row terms of the plain loss at depth 1
    feat = hid[:, :-1]
    pred = head(ids[:, 1:], feat)
    sel = mask[:, 1:]
    p, tgt = pred[sel], hid[:, 1:][sel]
    reg = torch.nn.functional.smooth_l1_loss(p, tgt, reduction="none").mean(-1)
    t_prob = torch.softmax(tgt @ W.T, -1)
    logp = torch.log_softmax(p @ W.T, -1)
    ce = -(t_prob * logp).sum(-1)
    acc = torch.minimum(t_prob, logp.exp()).sum(-1)
    w = torch.ones(p.shape[0])
    w[copy[:, 1:][sel]] = 3.0
    want = (reg * w).sum() / w.sum() + 0.1 * (ce * w).sum() / w.sum() + 0.5 * (1 - (acc * w).sum() / w.sum())
    assert torch.allclose(weighted, want, atol=1e-5)


def test_evaluate_splits_copy_and_other_positions():
    head, W, ids, hid, mask = _tiny_head_batch(seed=2, B=3, L=20)
    seqs = [{"ids": ids[b], "mask": mask[b], "hidden": hid[b]} for b in range(3)]
    ev = T.evaluate(head, W, seqs, 4096, depths=3, split_copy=True)
    for j in range(3):
        assert ev["copy"]["n_by_depth"][j] + ev["other"]["n_by_depth"][j] == ev["n_by_depth"][j]
        mixed = (ev["copy"]["acc_by_depth"][j] * ev["copy"]["n_by_depth"][j]
                 + ev["other"]["acc_by_depth"][j] * ev["other"]["n_by_depth"][j]) / ev["n_by_depth"][j]
        assert abs(mixed - ev["acc_by_depth"][j]) < 1e-9
    assert 0 < ev["copy"]["n_by_depth"][0] < ev["n_by_depth"][0]
    plain = T.evaluate(head, W, seqs, 4096, depths=3)
    assert plain["acc_by_depth"] == ev["acc_by_depth"] and "copy" not in plain
    with pytest.raises(ValueError, match="depths"):
        T.evaluate(head, W, seqs, 4096, depths=1, split_copy=True)


def test_evaluate_per_sequence_counts_add_up_to_the_pooled_rates():
    """per_sequence: each sequence's hit counts, scored in a batch with others, equal that sequence scored
    alone, and their sums give the pooled per-depth rates."""
    head, W, ids, hid, mask = _tiny_head_batch(seed=3, B=4, L=20)
    mask[1, 12:] = False                                   # unequal lengths of counted rows
    seqs = [{"ids": ids[b], "mask": mask[b], "hidden": hid[b]} for b in range(4)]
    ev = T.evaluate(head, W, seqs, 4096, depths=3, per_sequence=True)
    ps = ev["per_sequence"]
    assert ps["top1_hits"].shape == ps["top4_hits"].shape == ps["n"].shape == (3, 4)
    for j in range(3):
        assert int(ps["n"][j].sum()) == ev["n_by_depth"][j]
        assert abs(int(ps["top1_hits"][j].sum()) / ev["n_by_depth"][j] - ev["acc_by_depth"][j]) < 1e-6
        assert abs(int(ps["top4_hits"][j].sum()) / ev["n_by_depth"][j] - ev["top4_by_depth"][j]) < 1e-6
    assert bool((ps["top1_hits"] <= ps["top4_hits"]).all()) and bool((ps["top4_hits"] <= ps["n"]).all())
    for b in range(4):
        alone = T.evaluate(head, W, [seqs[b]], 4096, depths=3, per_sequence=True)["per_sequence"]
        for k in ("top1_hits", "top4_hits", "n"):
            assert torch.equal(alone[k][:, 0], ps[k][:, b]), (b, k)
    assert "per_sequence" not in T.evaluate(head, W, seqs, 4096, depths=3)
    with pytest.raises(ValueError, match="depths"):
        T.evaluate(head, W, seqs, 4096, depths=1, per_sequence=True)
    with pytest.raises(ValueError, match="ce_frac"):
        T.unrolled_loss(head, W, ids, hid, mask, steps=2, ce_frac=0.5, row_hits=True)


def test_paired_bootstrap_difference_and_standard_error():
    """The paired difference is the difference of pooled rates; identical heads give 0 ± 0; the SE of a
    difference spread over many records matches the analytic SE of a ratio estimator; resampling whole
    records (not sequences) widens it when a record's sequences move together; mismatched positions raise."""
    from research.heldout import paired_bootstrap

    g = torch.Generator().manual_seed(0)
    S = 400
    n = torch.randint(20, 60, (2, S), generator=g)
    a1 = torch.binomial(n.double(), torch.full((2, S), 0.6, dtype=torch.float64), generator=g).long()
    b1 = torch.binomial(n.double(), torch.full((2, S), 0.5, dtype=torch.float64), generator=g).long()
    a = {"top1_hits": a1, "top4_hits": a1, "n": n}
    b = {"top1_hits": b1, "top4_hits": b1, "n": n}
    r = paired_bootstrap(a, b, list(range(S)), resamples=2000)
    want = (a1 - b1).sum(1).double() / n.sum(1)
    assert r["top1_diff_by_depth"] == pytest.approx(want.tolist(), abs=1e-5)
    d = (a1 - b1).double() - want[:, None] * n                  # linearised ratio: SE = sqrt(sum d^2) / sum n
    se = d.pow(2).sum(1).sqrt() / n.sum(1)
    assert r["top1_se_by_depth"] == pytest.approx(se.tolist(), rel=0.1)
    same = paired_bootstrap(a, a, list(range(S)))
    assert same["top1_diff_by_depth"] == [0.0, 0.0] and same["top4_se_by_depth"] == [0.0, 0.0]
    # 100 records of 4 identical sequences each: the record is the unit, the SE is twice the per-sequence one
    rep = {k: v[:, :100].repeat_interleave(4, 1) for k, v in a.items()}
    rep_b = {k: v[:, :100].repeat_interleave(4, 1) for k, v in b.items()}
    by_rec = paired_bootstrap(rep, rep_b, torch.arange(400) // 4)["top1_se_by_depth"]
    by_seq = paired_bootstrap(rep, rep_b, torch.arange(400))["top1_se_by_depth"]
    assert all(1.6 < x / y < 2.4 for x, y in zip(by_rec, by_seq))
    with pytest.raises(ValueError, match="same positions"):
        paired_bootstrap(a, {**b, "n": n + 1}, list(range(S)))
    with pytest.raises(ValueError, match="group"):
        paired_bootstrap(a, b, list(range(S - 1)))


def test_train_layers_appends_an_identity_layer_to_init_and_trains_it(tiny_base, tiny_data, tmp_path):
    """--init H1 --layers 2: step 0 is H1's function (same held-out loss), the saved head has two
    layers, and the appended layer moved off zero; --layers below the init's count is refused."""
    from safetensors.torch import load_file

    data, _ = tiny_data
    common = ["--base", str(tiny_base), "--data", str(data), "--batch-tokens", "256", "--threads", "1",
              "--warmup", "1", "--val-frac", "0.3", "--eval-at-start"]
    h1 = tmp_path / "h1"
    T.main(common + ["--out", str(h1), "--max-steps", "10", "--lr", "3e-3"])
    h2 = tmp_path / "h2"
    log = T.main(common + ["--out", str(h2), "--max-steps", "15", "--init", str(h1), "--layers", "2", "--lr", "1e-9",
                           "--new-layer-lr", "3e-3", "--unroll", "2"])
    ref = T.main(common + ["--out", str(tmp_path / "h1b"), "--max-steps", "1", "--init", str(h1), "--lr", "1e-9",
                           "--unroll", "2"])
    assert log["eval"][0]["loss"] == pytest.approx(ref["eval"][0]["loss"], rel=1e-5)
    s1, s2 = load_file(str(h1 / "model.safetensors")), load_file(str(h2 / "model.safetensors"))
    assert json.load(open(h2 / "config.json"))["num_hidden_layers"] == 2
    assert s2["layers.1.self_attn.o_proj.weight"].abs().max() > 0  # the new layer trained (its own rate)
    assert torch.allclose(s1["fc.weight"].float(), s2["fc.weight"].float(), atol=1e-3)  # the old ones barely (1e-9)
    with pytest.raises(ValueError, match="appends none"):
        T.main(common + ["--out", str(tmp_path / "h4"), "--max-steps", "1", "--init", str(h2), "--layers", "2",
                         "--new-layer-lr", "1e-3"])
    with pytest.raises(ValueError, match="--layers 1"):
        T.main(common + ["--out", str(tmp_path / "h3"), "--max-steps", "1", "--init", str(h2), "--layers", "1"])


@pytest.mark.parametrize("bad, flag", [(["--layers", "-1"], "--layers"), (["--new-layer-lr", "nan"], "--new-layer-lr"),
                                       (["--new-layer-lr", "1e-3"], "--new-layer-lr")])
def test_layer_flags_are_checked_before_any_work(bad, flag, tmp_path, capsys):
    with pytest.raises(SystemExit):
        T.main(["--data", str(tmp_path / "none"), "--out", str(tmp_path / "o"), *bad])
    assert flag in capsys.readouterr().err


def test_bf16_autocast_step_tracks_the_float32_step():
    """--autocast bf16: the same unrolled loss and nearly the same gradient; weights and gradients stay float32."""
    head, lm_w, ids, hid, mask = _tiny_head_batch(seed=3, B=2, L=24, H=64, V=50)
    kw = dict(steps=3, noise=0.0, w_ce=0.1, ce_frac=1.0, w_tv=0.5)

    def grads(bf16: bool):
        head.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, _ = T.unrolled_loss(head, lm_w, ids, hid, mask, **kw)
        loss.backward()
        g = torch.cat([p.grad.flatten() for p in head.parameters() if p.grad is not None])
        assert all(p.grad.dtype == torch.float32 for p in head.parameters() if p.grad is not None)
        return float(loss.detach()), g

    l32, g32 = grads(False)
    l16, g16 = grads(True)
    assert abs(l16 - l32) < 0.02 * abs(l32)
    assert torch.nn.functional.cosine_similarity(g16, g32, dim=0) > 0.99
    assert all(p.dtype == torch.float32 for p in head.parameters())


def test_train_autocast_bf16_reduces_loss(tiny_base, tiny_data, tmp_path):
    data, _ = tiny_data
    out = tmp_path / "head"
    log = T.main(["--base", str(tiny_base), "--data", str(data), "--out", str(out), "--max-steps", "40",
                  "--lr", "3e-3", "--warmup", "2", "--batch-tokens", "256", "--val-frac", "0.2", "--unroll", "2",
                  "--log-every", "5", "--eval-at-start", "--noise", "0.05", "--threads", "1", "--autocast", "bf16"])
    assert log["args"]["autocast"] == "bf16"
    assert log["history"][-1]["loss"] < 0.8 * log["history"][0]["loss"]
    assert log["eval"][-1]["loss"] < log["eval"][0]["loss"]


def test_autocast_flag_is_checked_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit):
        T.main(["--data", str(tmp_path), "--out", str(tmp_path / "o"), "--autocast", "fp8"])
    assert "--autocast" in capsys.readouterr().err


def test_bench_train_step_compares_modes_on_the_same_batches(tiny_base, tiny_data, tmp_path):
    from research import bench_train_step

    data, _ = tiny_data
    head = tmp_path / "head"
    T.main(["--base", str(tiny_base), "--data", str(data), "--out", str(head), "--max-steps", "2", "--warmup", "1",
            "--batch-tokens", "256", "--val-frac", "0.2", "--threads", "1"])
    res = bench_train_step.main(["--data", str(data), "--init", str(head), "--base", str(tiny_base), "--batches", "2",
                                 "--batch-tokens", "128", "--unroll", "2", "--threads", "1", "--max-len", "64",
                                 "--out", str(tmp_path / "b.json")])
    assert [r["mode"] for r in res["rows"]] == ["float32", "bf16"]
    bf = res["rows"][1]
    assert bf["speedup"] > 0 and bf["loss_rel_diff_max"] < 0.05 and 0.99 < bf["grad_cosine_min"] <= 1.0 + 1e-9
    assert json.loads((tmp_path / "b.json").read_text())["rows"] == res["rows"]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")
def test_release_free_heap_returns_fragmented_free_pages_to_the_system():
    """Freed mid-sized blocks below a live one stay resident under glibc until malloc_trim hands them back."""
    if not T.release_free_heap():
        pytest.skip("no glibc malloc_trim here")
    blocks = [bytearray(b"\1" * (64 * 1024)) for _ in range(4000)]  # 256 MB of 64 KB heap blocks, pages touched
    keep = blocks[-1]
    del blocks  # all but the highest block are free; the live one pins the heap's top
    before = _rss_bytes()
    assert T.release_free_heap()
    after = _rss_bytes()
    assert len(keep) == 64 * 1024
    assert before - after > 100 * 2 ** 20, (before, after)


def test_malloc_trim_flag_is_checked_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit):
        T.main(["--data", str(tmp_path), "--out", str(tmp_path / "o"), "--malloc-trim-steps", "-1"])
    assert "--malloc-trim-steps" in capsys.readouterr().err
