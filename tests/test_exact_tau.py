"""Exact expected tau: Block Verification on chains, agreement with the sampled tau, pairing across methods."""
import math

import numpy as np
import pytest
import torch

from evaluation import exact_tau as X


@pytest.fixture(scope="module")
def tiny():
    from eagle.testing import tiny_ea_model

    torch.set_num_threads(1)
    return tiny_ea_model(vocab_size=32, seed=0, aligned=True)


PROMPT = [3, 7, 1, 4, 9, 2, 6]


def test_expected_tokens_of_a_hand_made_law():
    law = torch.zeros(3, 4)
    law[0, 1], law[1, 2], law[2, 0] = 0.2, 0.5, 0.3   # end at root / depth-1 node / depth-2 node
    assert X.expected_tokens(law, torch.tensor([0, 1, 2])) == pytest.approx(0.2 * 1 + 0.5 * 2 + 0.3 * 3)


def test_branch_usage_of_a_hand_made_law():
    # root 0; children 1, 2 (ranks 0, 1); 3 under 1; 4 under 3
    parents, depth = torch.tensor([-1, 0, 0, 1, 3]), torch.tensor([0, 1, 1, 2, 3])
    law = torch.zeros(5, 3)
    law[0, 0], law[1, 1], law[2, 2], law[3, 0], law[4, 1] = 0.1, 0.2, 0.3, 0.15, 0.25
    enter, tokens = X.branch_usage(law, parents, depth)
    assert enter == pytest.approx([0.2 + 0.15 + 0.25, 0.3])
    assert tokens == pytest.approx([0.2 * 2 + 0.15 * 3 + 0.25 * 4, 0.3 * 2])
    assert sum(tokens) + 1 - sum(enter) == pytest.approx(X.expected_tokens(law, depth))


@pytest.mark.parametrize("method", ["rrsw", "univer"])
def test_branch_usage_adds_up_to_exact_tau(tiny, method):
    v = X.verifier_for(method, 1.0)
    for s in range(3):
        laws = tiny.tree_laws(torch.tensor([PROMPT + [s]]), tree_choices="mc_sim_7b_63", drafting=v.drafting,
                              temperature=1.0, generator=torch.Generator().manual_seed(s))
        law = v.outcome_probs(laws.parents, laws.tokens, laws.target_probs, laws.draft_probs)
        enter, tokens = X.branch_usage(law, laws.parents, laws.depth)
        assert len(enter) == 4 and all(0 <= e <= 1 for e in enter) and sum(enter) <= 1 + 1e-6
        assert sum(tokens) + 1 - sum(enter) == pytest.approx(X.expected_tokens(law, laws.depth), abs=1e-6)  # law sums to 1 in float32


@pytest.mark.parametrize("drafting", ["wor", "topk_residual"])
def test_chain_exact_tau_equals_block_verification(tiny, drafting):
    from univer_patch import block

    for s in range(4):
        g = torch.Generator().manual_seed(s)
        laws = tiny.tree_laws(torch.tensor([PROMPT + [s + 10]]), tree_choices="chain4", drafting=drafting,
                              temperature=1.0, generator=g)
        args = (laws.parents, laws.tokens, laws.target_probs, laws.draft_probs)
        ref = X.expected_tokens(block.outcome_probs(*args), laws.depth)
        for m in ("univer", "traversal"):
            got = X.expected_tokens(X.verifier_for(m, 1.0).outcome_probs(*args), laws.depth)
            assert got == pytest.approx(ref, abs=1e-5), (m, s)
        assert 1.0 <= ref <= 5.0


def _cycles(tiny, method, seeds, tree="2x2", n_new=40):
    """(contexts at cycle starts, sampled accept lengths, Rao-Blackwellised values) of full cycles."""
    ctxs, sampled, rb = [], [], []
    for s in seeds:
        prompt = PROMPT + [s % 32]
        out, st = tiny.eagenerate(torch.tensor([prompt]), temperature=1.0, max_new_tokens=n_new, tree_choices=tree,
                                  verifier=method, seed=s, return_stats=True, expected_tau=True)
        new = out[0, len(prompt):].tolist()
        acc, exp = st["accept_lengths"], st["expected_accept_lengths"]
        done = 1
        for k in range(len(acc) - 1):            # the last cycle may be cut by max_new_tokens
            ctxs.append({"question_id": s, "group": "qa", "turn": 0, "position": done,
                         "input_ids": prompt + new[:done]})
            sampled.append(acc[k])
            rb.append(exp[k])
            done += acc[k]
    return ctxs, np.array(sampled, float), np.array(rb, float)


@pytest.mark.parametrize("method", ["univer", "rrsw"])
def test_exact_tau_agrees_with_sampled_tau(tiny, method):
    ctxs, sampled, rb = _cycles(tiny, method, range(12))
    assert len(sampled) > 60
    se = sampled.std(ddof=1) / math.sqrt(len(sampled))
    # (1) Rao-Blackwellised: per-cycle exact E[tokens | the tree the run drafted], same cycles
    assert abs(rb.mean() - sampled.mean()) < 3.5 * se
    assert rb.std() < sampled.std()                      # much less noise per cycle
    # (2) shared-context view at the same cycle starts with fresh tree draws
    scored = X.score_contexts(tiny, ctxs, [method], tree="2x2", temperature=1.0, draws=1, seed=5)
    exact = np.array([r["values"][method] for r in scored])
    d = sampled - exact
    assert abs(d.mean()) < 3.5 * d.std(ddof=1) / math.sqrt(len(d))


def test_shared_contexts_are_paired_across_methods(tiny):
    ref = []
    for qid, cat in [(81, "writing"), (82, "roleplay"), (161, "translation"), (162, "translation")]:
        ids = [(qid + i) % 32 for i in range(9)]
        ref.append({"question_id": qid, "category": cat,
                    "choices": [{"turns": ["a", "b"], "new_token_ids": [ids, ids[:5]]}]})
    questions = [{"question_id": r["question_id"], "category": r["category"], "turns": ["q1", "q2"]} for r in ref]
    prompt_ids = lambda msgs: [5 + len(m["content"]) % 20 for m in msgs]  # noqa: E731
    methods = ["rrsw", "traversal", "greedy", "univer"]
    calls = []
    real = tiny.tree_laws

    def counting(*a, **k):
        calls.append(k["drafting"])
        return real(*a, **k)

    tiny.tree_laws = counting
    try:
        ex = X.run_exact_tau(tiny, ref, questions, methods, prompt_ids=prompt_ids, tree="2x2", temperature=1.0,
                             contexts_per_question=3, draws=2, seed=0, n_boot=200, progress=False)
    finally:
        del tiny.tree_laws
    assert ex["n_contexts"] == 12 and ex["groups"] == ["mt_bench", "translation"]
    assert ex["drafting"] == {"rrsw": "wor", "traversal": "wor", "greedy": "topk_residual",
                              "univer": "topk_residual"}
    # one target forward per (context, drafting rule, draw), shared by the methods of that rule
    assert sorted(calls) == ["topk_residual"] * 24 + ["wor"] * 24
    rows = {r["method"]: r for r in ex["rows"]}
    assert rows["rrsw"]["delta_pct"] is None and rows["univer"]["delta_pct"]["se"] is not None
    assert rows["univer"]["avg_tau"]["mean"] == pytest.approx(
        np.mean([rows["univer"]["tau"][g]["mean"] for g in ex["groups"]]))
    md = X.render_exact(ex, "SMOKE RUN")
    assert md.startswith("**SMOKE RUN**") and "| UniVer |" in md and "Δ vs RRSw" in md and "±" in md


def test_context_positions():
    assert X.context_positions([5], 2) == [(0, 1), (0, 4)]
    assert X.context_positions([3, 2], 10) == [(0, 1), (0, 2), (1, 1)]
    assert X.context_positions([1], 3) == [] and X.context_positions([9], 0) == []


def test_exact_tau_on_meta_default_device(tiny):
    """Every tensor of the exact-tau path is created on the model's device (as on CUDA)."""
    ctxs = [{"question_id": 1, "group": "qa", "turn": 0, "position": 2, "input_ids": PROMPT + [5, 6]}]
    torch.set_default_device("meta")
    try:
        scored = X.score_contexts(tiny, ctxs, ["rrsw", "univer"], tree="2x2", temperature=1.0, draws=1, seed=0)
    finally:
        torch.set_default_device(None)
    assert all(1.0 <= v <= 3.0 + 1e-6 for v in scored[0]["values"].values())


def test_cli_generates_its_reference_and_writes_tables(tiny, tmp_path, monkeypatch, capsys):
    import json

    from evaluation import arguments

    class Fmt:
        name = "test"

        @staticmethod
        def ids(tok, messages):
            return [3 + len(m["content"]) % 20 for m in messages] + [1, 2]

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    tiny.tokenizer = Tok()
    monkeypatch.setattr(arguments, "load_checked_model", lambda cfg: (tiny, Fmt()))
    qs = [{"question_id": 81 + i, "category": c, "turns": ["a b", "c"] if c == "writing" else ["d e f"]}
          for i, c in enumerate(["writing", "writing", "qa", "qa"])]
    qf = tmp_path / "q.jsonl"
    qf.write_text("".join(json.dumps(q) + "\n" for q in qs))
    try:
        ex = X.main(["--question-file", str(qf), "--tree", "2x2", "--methods", "rrsw", "univer", "--max-new-tokens",
                     "8", "--contexts-per-question", "2", "--seeds", "1", "--out", str(tmp_path / "o"),
                     "--no-progress", "--bootstrap", "50"])
    finally:
        tiny.tokenizer = None
    assert ex["n_contexts"] == 8 and [r["method"] for r in ex["rows"]] == ["rrsw", "univer"]
    assert (tmp_path / "o" / "exact_tau.md").read_text().startswith("Exact expected τ")
    assert "| UniVer |" in capsys.readouterr().out
    md = (tmp_path / "o" / "exact_tau.md").read_text()
    assert "no draft token accepted" in md and all(r["branches"]["enter"] for r in ex["rows"])


# ---- EAGLE-2 dynamic trees (issue 50 follow-up): exact tau builds them like the engine does -----------------
DYN = "eagle2:nodes=8,depth=4,topk=3"


def test_exact_tau_on_a_dynamic_tree_at_temperature_0_is_the_engines_cycle_length(tiny):
    """At temperature 0 a cycle's length is deterministic: exact tau at the engine's own cycle starts equals the
    tokens each cycle of ``eagenerate`` appended (the direct computation), through the shared-prefill path
    (``score_contexts_trees``, a dynamic and a static tree together) and the per-tree path alike."""
    prompt = torch.tensor([PROMPT])
    out, stats = tiny.eagenerate(prompt, temperature=0.0, max_new_tokens=24, tree_choices=DYN, return_stats=True)
    acc = stats["accept_lengths"]
    assert max(acc) > 1                                    # the tiny aligned model accepts draft tokens here
    starts = [len(PROMPT) + 1 + sum(acc[:j]) for j in range(len(acc) - 1)]   # the last cycle may be truncated
    ctxs = [{"question_id": 1, "group": "qa", "turn": 0, "position": j, "input_ids": out[0, :n].tolist()}
            for j, n in enumerate(starts)]
    both = X.score_contexts_trees(tiny, ctxs, ["greedy", "univer"], trees=[DYN, "2x2"], temperature=0.0)
    alone = X.score_contexts(tiny, ctxs, ["greedy", "univer"], tree=DYN, temperature=0.0)
    assert both[DYN] == alone
    for rec, a in zip(alone, acc):
        assert rec["values"] == {"greedy": pytest.approx(a), "univer": pytest.approx(a)}
    assert both["2x2"] == X.score_contexts(tiny, ctxs, ["greedy", "univer"], tree="2x2", temperature=0.0)


def test_exact_tau_on_a_dynamic_tree_shared_prefill_equals_tree_laws(tiny):
    """At temperature 1 (Greedy / UniVer: the dynamic shape drafted under topk_residual) every tree of the shared
    prefill equals a separate ``tree_laws`` call with the same generator, and its exact tau is the verifier's
    outcome law summed by hand; a dynamic tree under rule ``wor`` is refused in one line."""
    from eagle.verify import get_verifier

    ids = torch.tensor([PROMPT + [5, 8]])
    specs = [(DYN, "topk_residual", 3), ("2x2", "wor", 4), ("eagle2:nodes=3,depth=2,topk=2", "topk", 5)]
    shared = list(X.tree_laws_shared(tiny, ids, [(t, r, torch.Generator().manual_seed(s)) for t, r, s in specs],
                                     temperature=1.0))
    for (t, r, s), got in zip(specs, shared):
        ref = tiny.tree_laws(ids, tree_choices=t, drafting=r, temperature=1.0, generator=torch.Generator().manual_seed(s))
        for k in ("parents", "tokens", "depth", "target_probs", "draft_probs"):
            assert torch.equal(getattr(got, k), getattr(ref, k)), (t, k)
    laws = shared[0]
    assert laws.parents.numel() == 9
    law = get_verifier("univer").outcome_probs(laws.parents, laws.tokens, laws.target_probs, laws.draft_probs)
    by_hand = sum(float(law[i].sum()) * (int(laws.depth[i]) + 1) for i in range(laws.parents.numel()))
    assert X.expected_tokens(law, laws.depth) == pytest.approx(by_hand) and 1.0 <= by_hand <= 5.0
    with pytest.raises(ValueError, match="cannot serve drafting rule 'wor'") as e:
        list(X.tree_laws_shared(tiny, ids, [(DYN, "wor", None), ("2x2", "wor", None)], temperature=1.0))
    assert "\n" not in str(e.value)


def test_cli_runs_exact_tau_on_a_dynamic_tree(tiny, tmp_path, monkeypatch):
    """``--tree eagle2:...`` with exact tau on (no --contexts-per-question 0 needed any more)."""
    import json

    from evaluation import arguments

    class Fmt:
        name = "test"

        @staticmethod
        def ids(tok, messages):
            return [3 + len(m["content"]) % 20 for m in messages] + [1, 2]

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    tiny.tokenizer = Tok()
    monkeypatch.setattr(arguments, "load_checked_model", lambda cfg: (tiny, Fmt()))
    qf = tmp_path / "q.jsonl"
    qf.write_text("".join(json.dumps({"question_id": 81 + i, "category": c, "turns": ["a b c"]}) + "\n"
                          for i, c in enumerate(["writing", "qa"])))
    try:
        ex = X.main(["--question-file", str(qf), "--tree", DYN, "--methods", "greedy", "univer", "--max-new-tokens",
                     "8", "--seeds", "1", "--out", str(tmp_path / "o"), "--no-progress", "--bootstrap", "20"])
    finally:
        tiny.tokenizer = None
    assert ex["tree"] == DYN and ex["n_contexts"] > 2 and [r["method"] for r in ex["rows"]] == ["greedy", "univer"]
    assert all(r["avg_tau"]["mean"] >= 1.0 for r in ex["rows"])
    assert (tmp_path / "o" / "exact_tau.md").read_text().startswith("Exact expected τ")


def test_shared_prefill_passes_an_eagle3_drafters_fused_features(tmp_path):
    """The shared prefill asks the target for the hidden states the drafter declares (EAGLE-3: three layers
    fused), so its trees equal separate ``tree_laws`` calls."""
    from eagle.model.ea_model import EaModel
    from test_eagle3 import PROMPT as P3, eagle3_config, random_state, target, write_checkpoint

    base = target()
    cfg = eagle3_config(base.config)
    write_checkpoint(tmp_path / "e3", cfg, random_state(cfg))
    m = EaModel(base, None, drafter="eagle3", drafter_options={"path": str(tmp_path / "e3")})
    ids = torch.cat([P3, torch.tensor([[6, 2]])], 1)
    specs = [("2x2", "topk_residual", 1), ("chain3", "wor", 2)]
    shared = list(X.tree_laws_shared(m, ids, [(t, r, torch.Generator().manual_seed(s)) for t, r, s in specs],
                                     temperature=1.0))
    for (t, r, s), got in zip(specs, shared):
        ref = m.tree_laws(ids, tree_choices=t, drafting=r, temperature=1.0, generator=torch.Generator().manual_seed(s))
        for k in ("parents", "tokens", "depth", "target_probs", "draft_probs"):
            assert torch.equal(getattr(got, k), getattr(ref, k)), (t, k)
