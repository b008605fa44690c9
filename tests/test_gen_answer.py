"""gen_answer on the tiny random EaModel: valid Spec-Bench JSONL, multi-turn prompts, resuming."""
import json

import pytest

from evaluation import gen_answer as G
from evaluation import speed
from harness_helpers import QUESTIONS, _CharTok, specbench_speed


@pytest.fixture(scope="module")
def tiny():
    import torch

    from eagle.testing import tiny_ea_model

    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: threads only add overhead (and spin on a shared CPU)
    yield tiny_ea_model(vocab_size=32, seed=0, aligned=True)
    torch.set_num_threads(n)


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_writes_valid_jsonl_and_resumes(tiny, tmp_path):
    tok = _CharTok()
    out = tmp_path / "ans" / "univer.jsonl"
    kw = dict(temperature=1.0, tree="2x2", seed=3, max_new_tokens=6, tokenizer=tok, progress=False)
    n = G.generate_answers(tiny, QUESTIONS[:2], out, "univer", **kw)
    assert n == 2
    recs = _lines(out)
    assert [r["question_id"] for r in recs] == [81, 161]
    for r, q in zip(recs, QUESTIONS):
        assert {"question_id", "category", "answer_id", "model_id", "choices", "tstamp", "model", "head", "method",
                "seed", "temperature", "top_p", "tree", "max_new_tokens", "device", "dtype", "threads", "commit",
                "head_sha256", "prompt_format"} <= set(r)
        assert r["dtype"] == "torch.float32" and r["device"] == "cpu" and r["threads"] >= 1
        assert (r["method"], r["seed"], r["tree"], r["max_new_tokens"]) == ("univer", 3, "2x2", 6)
        c = r["choices"][0]
        assert c["index"] == 0
        nt = len(q["turns"])
        for key in ("turns", "decoding_steps", "new_tokens", "wall_time", "new_token_ids", "timing"):
            assert len(c[key]) == nt, key
        # Spec-Bench's format: ONE flat list of ints over all turns, split by decoding_steps
        assert all(isinstance(a, int) and a >= 1 for a in c["accept_lengths"])
        assert len(c["accept_lengths"]) == sum(c["decoding_steps"]) == len(c["expected_accept_lengths"])
        assert all(1.0 <= e <= 3.0 + 1e-6 for e in c["expected_accept_lengths"])  # 2x2 tree: at most 3 per cycle
        for new, wall, ids, timing in zip(c["new_tokens"], c["wall_time"], c["new_token_ids"], c["timing"]):
            assert 1 <= new <= 6 and wall > 0 and len(ids) == new
            assert {"draft", "target_forward", "verify"} <= set(timing)
        assert sum(c["accept_lengths"]) == sum(n - 1 for n in c["new_tokens"])  # first token of a turn: prefill
    # turn 2's prompt holds turn 1's question and the model's turn-1 answer
    two_turn = [m for m in tok.rendered if len(m) == 3]
    assert two_turn and two_turn[-1][0]["content"] == "Write a poem."
    assert two_turn[-1][1] == {"role": "assistant", "content": recs[0]["choices"][0]["turns"][0]}

    # resume: only the missing question is generated, the old lines stay untouched
    before = out.read_text()
    n2 = G.generate_answers(tiny, QUESTIONS, out, "univer", **kw)
    assert n2 == 1
    assert out.read_text().startswith(before)
    assert [r["question_id"] for r in _lines(out)] == [81, 161, 241]
    assert G.generate_answers(tiny, QUESTIONS, out, "univer", **kw) == 0


def test_run_naive_and_method_then_metrics(tiny, tmp_path):
    files = G.run(tiny, QUESTIONS, tmp_path, ["naive", "greedy"], [0], temperature=1.0, tree="2x2",
                  max_new_tokens=5, tokenizer=_CharTok(), progress=False)
    assert [f.name for f in files] == ["naive-temp1-seed0.jsonl", "greedy-temp1-2x2-seed0.jsonl"]
    naive = _lines(files[0])
    assert all(r["tree"] is None and set(r["choices"][0]["accept_lengths"]) <= {1} for r in naive)
    res = speed.summarize(speed.collect_runs([tmp_path]), n_boot=50)
    assert [(r["method"], r["tree"]) for r in res["runs"]] == [("naive", None), ("greedy", "2x2")]
    assert res["runs"][0]["summary"]["avg"]["tau"]["mean"] == pytest.approx(1.0)
    assert res["runs"][1]["summary"]["overall"]["speedup"]["mean"] > 0
    assert res["runs"][1]["timing"]["share"]["draft"] > 0
    # Spec-Bench's own computation (harness_helpers.specbench_speed) reads these files for every task
    for task in ("mt_bench", "translation", "qa", "overall"):
        *_, mean_acc = specbench_speed(files[1], files[0], lambda t: [0] * (len(t) + 1), task)
        assert mean_acc >= 1.0


def test_progress_moves_within_a_question(tiny):
    ticks = []
    q = {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]}
    G.generate_turns(tiny, _CharTok(), q, "rrsw", temperature=1.0, tree="2x2", max_new_tokens=8, seed=0,
                     on_tokens=ticks.append)
    assert sum(ticks) == 2 * 8            # topped up to max_new_tokens per turn: the bar ends full
    assert len(ticks) > 4                 # several updates per turn, not one per question


def test_same_seed_same_answers(tiny, tmp_path):
    kw = dict(temperature=1.0, tree="2x2", seed=7, max_new_tokens=5, tokenizer=_CharTok(), progress=False,
              warmup=False)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    G.generate_answers(tiny, QUESTIONS[1:2], a, "rrsw", **kw)
    G.generate_answers(tiny, QUESTIONS[1:2], b, "rrsw", **kw)
    assert _lines(a)[0]["choices"][0]["turns"] == _lines(b)[0]["choices"][0]["turns"]


def test_helpers():
    assert G.answer_file_name("naive", 1.0, "2x5", 0) == "naive-temp1-seed0.jsonl"
    assert G.answer_file_name("univer", 0.3, "mc_sim_7b_63", 2) == "univer-temp0.3-mc_sim_7b_63-seed2.jsonl"
    assert G.call_seed(1, 81, 1) != G.call_seed(0, 81, 1) != G.call_seed(0, 81, 0)
    dev, dt = G.resolve_device("cpu", "auto")
    import torch

    assert (dev, dt) == ("cpu", torch.float32)


def test_resume_refuses_other_settings(tiny, tmp_path):
    out = tmp_path / "a.jsonl"
    G.generate_answers(tiny, QUESTIONS[1:2], out, "rrsw", temperature=1.0, tree="2x2", seed=0, max_new_tokens=4,
                       tokenizer=_CharTok(), progress=False, warmup=False)
    same = {"method": "rrsw", "temperature": 1.0, "tree": "2x2", "seed": 0, "max_new_tokens": 4, "top_p": 1.0}
    assert G.resume_conflict(out, same) is None
    assert G.resume_conflict(tmp_path / "missing.jsonl", same) is None
    why = G.resume_conflict(out, dict(same, max_new_tokens=8))
    assert why.startswith(str(out)) and "max_new_tokens=4" in why and "max_new_tokens=8" in why


def test_resolved_tree_choices_go_to_the_engine_label_to_the_files(tiny, tmp_path):
    choices = [[0], [1], [0, 0]]
    files = G.run(tiny, QUESTIONS[1:2], tmp_path, ["rrsw"], [0], temperature=1.0, tree="auto", max_new_tokens=6,
                  tokenizer=_CharTok(), progress=False, tree_choices=choices)
    assert files[0].name == "rrsw-temp1-auto-seed0.jsonl"
    rec = _lines(files[0])[0]
    assert rec["tree"] == "auto" and rec["tree_choices"] == choices
    assert max(rec["choices"][0]["accept_lengths"]) <= 3      # depth 2 tree: at most 2 drafted + 1
    # resuming with another fitted tree (other threads, a refreshed fit) is refused, the same one is not
    same = {"method": "rrsw", "temperature": 1.0, "tree": "auto", "seed": 0, "tree_choices": choices}
    assert G.resume_conflict(files[0], same) is None
    why = G.resume_conflict(files[0], dict(same, tree_choices=[[0], [1]]))
    assert why is not None and "tree_choices" in why


def test_run_interleaves_methods_question_by_question(tiny, tmp_path):
    """Round-robin: every method answers question i before any answers question i + 1 (machine drift is
    shared); the records are the same as method-by-method."""
    calls = []
    orig_gen, orig_naive = tiny.eagenerate, tiny.naivegenerate

    def spy(fn, name):
        def wrapped(input_ids, *a, **k):
            calls.append((name, int(input_ids.shape[-1])))
            return fn(input_ids, *a, **k)
        return wrapped

    tiny.eagenerate, tiny.naivegenerate = spy(orig_gen, "spec"), spy(orig_naive, "naive")
    try:
        kw = dict(temperature=1.0, tree="2x2", max_new_tokens=5, tokenizer=_CharTok(), progress=False)
        a = G.run(tiny, QUESTIONS, tmp_path / "a", ["naive", "rrsw"], [0], **kw)
        order = [n for n, _ in calls]
        calls.clear()
        b = G.run(tiny, QUESTIONS, tmp_path / "b", ["naive", "rrsw"], [0], interleave=False, **kw)
        order_b = [n for n, _ in calls]
    finally:
        del tiny.eagenerate, tiny.naivegenerate
    switches = sum(x != y for x, y in zip(order, order[1:]))
    assert switches >= len(QUESTIONS) and sum(x != y for x, y in zip(order_b, order_b[1:])) == 1
    for fa, fb in zip(a, b):
        ra, rb = _lines(fa), _lines(fb)
        assert [r["question_id"] for r in ra] == [r["question_id"] for r in rb] == [q["question_id"] for q in QUESTIONS]
        assert [r["choices"][0]["turns"] for r in ra] == [r["choices"][0]["turns"] for r in rb]
    assert G.run(tiny, QUESTIONS, tmp_path / "a", ["naive", "rrsw"], [0], **kw) == a  # resumed: nothing new
    assert [len(_lines(f)) for f in a] == [len(QUESTIONS)] * 2


# ---- drafter options in the resume key (issue 50 follow-up) ---------------------------------------------------
def test_provenance_records_drafter_options_only_when_there_are_some(tiny):
    import torch

    plain = G.provenance(tiny)
    assert "drafter_options" not in plain and plain["drafter"] == "eagle"
    with_opts = G.provenance(tiny, drafter_options={"model_path_or_module": G.Path("/m/draft"),
                                                    "dtype": torch.float16, "depth": 4})
    assert with_opts["drafter_options"] == {"model_path_or_module": "/m/draft", "dtype": "torch.float16", "depth": 4}
    assert G.json_options({"m": torch.nn.Linear(2, 2), "xs": (1, 2)}) == {"m": "<Linear>", "xs": [1, 2]}
    assert list(with_opts) == [k for k in plain if k != "prompt_format"] + ["drafter_options", "prompt_format"]


def test_resume_key_separates_draft_models(tiny, tmp_path):
    """Two draft models never share an answer file; files without options resume as before (same keys)."""
    common = dict(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=4, tree="2x2")
    base = G.provenance(tiny)
    a = dict(base, drafter="draft_lm", drafter_options={"model_path_or_module": "org/a"})
    b = dict(a, drafter_options={"model_path_or_module": "org/b"})
    f = tmp_path / "rrsw.jsonl"
    G.generate_answers(tiny, QUESTIONS[1:2], f, "rrsw", seed=0, tokenizer=_CharTok(), progress=False, warmup=False,
                       run_info=a, **common)
    assert _lines(f)[0]["drafter_options"] == {"model_path_or_module": "org/a"}
    key = lambda info, m="rrsw": G.resume_settings(info, m, seed=0, **common)  # noqa: E731
    assert G.resume_conflict(f, key(a)) is None
    why = G.resume_conflict(f, key(b))
    assert why is not None and "drafter_options" in why and "org/a" in why and "org/b" in why
    assert "drafter_options" in G.resume_conflict(f, key(dict(a, drafter_options=None)))   # options vs none
    # a file written without options: its records have no drafter_options key, and the same run resumes it
    g = tmp_path / "plain.jsonl"
    G.generate_answers(tiny, QUESTIONS[1:2], g, "rrsw", seed=0, tokenizer=_CharTok(), progress=False, warmup=False,
                       run_info=base, **common)
    assert "drafter_options" not in _lines(g)[0]
    assert "drafter_options" not in key(base) and G.resume_conflict(g, key(base)) is None
    assert "drafter_options" in G.resume_conflict(g, key(dict(base, drafter_options={"depth": 3})))
    # plain decoding does not draft: its key has no drafter
    assert "drafter" not in key(a, "naive") and key(a, "naive")["tree"] is None


@pytest.mark.filterwarnings("ignore")
def test_cli_refuses_a_second_draft_model_in_one_out(tmp_path, capsys):
    """gen_answer's command line with --drafter draft_lm on tiny folders: a second draft model into the same --out
    is refused in one line before any work; the first one's resumes."""
    from harness_helpers import tiny_draft_lm_folders

    folders = tiny_draft_lm_folders(tmp_path / "models")
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 81, "category": "writing", "turns": ["Write a poem."]}) + "\n")
    argv = ["--model", str(folders / "target"), "--drafter", "draft_lm", "--methods", "rrsw", "--seeds", "0",
            "--tree", "2x2", "--max-new-tokens", "4", "--question-file", str(q), "--out", str(tmp_path / "o"),
            "--device", "cpu", "--dtype", "float32", "--no-progress"]
    files = G.main(argv + ["--drafter-option", f"model_path_or_module={folders / 'near'}"])
    rec = _lines(files[0])[0]
    assert rec["drafter"] == "draft_lm" and rec["drafter_options"] == {"model_path_or_module": str(folders / "near")}
    G.main(argv + ["--drafter-option", f"model_path_or_module={folders / 'near'}"])   # resumes: nothing new
    assert len(_lines(files[0])) == 1
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        G.main(argv + ["--drafter-option", f"model_path_or_module={folders / 'far'}"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith("gen_answer: error: --out:") and "drafter_options" in err and "far" in err
