"""Engine interfaces used by the harness and the benchmarks: per-part timing, expected tau, tree_laws."""
import math

import pytest
import torch

import univer_patch  # noqa: F401  (registers traversal / greedy / univer)
from eagle.model.ea_model import TIMING_PARTS
from eagle.testing import tiny_ea_model
from eagle.verify.registry import get_verifier

IDS = torch.tensor([[1, 2, 3, 4, 5]])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_timing_parts_sum_to_wall_time(temperature):
    m = tiny_ea_model(vocab_size=32, seed=1, aligned=True)
    _, st = m.eagenerate(IDS, temperature=temperature, max_new_tokens=20, tree_choices="2x5", verifier="rrsw",
                         seed=0, return_stats=True)
    t = st["timing"]
    assert tuple(t) == TIMING_PARTS
    assert all(v >= 0 for v in t.values())
    assert t["draft"] > 0 and t["target_forward"] > 0 and t["verify"] > 0
    assert math.isclose(sum(t.values()), st["wall_time"], rel_tol=1e-6, abs_tol=1e-6)
    assert 0 < st["prefill_s"] <= t["target_forward"] + t["target_laws"]
    _, naive = m.naivegenerate(IDS, temperature=temperature, max_new_tokens=10, seed=0, return_stats=True)
    assert tuple(naive["timing"]) == TIMING_PARTS and naive["timing"]["target_forward"] > 0
    assert math.isclose(sum(naive["timing"].values()), naive["wall_time"], rel_tol=1e-6, abs_tol=1e-6)
    assert 0 < naive["prefill_s"] <= naive["timing"]["target_forward"] + naive["timing"]["target_laws"]


def test_expected_tau_at_temperature_0_is_the_accept_length():
    m = tiny_ea_model(vocab_size=32, seed=1, aligned=True)
    _, st = m.eagenerate(IDS, temperature=0.0, max_new_tokens=40, tree_choices="mc_sim_7b_63", return_stats=True,
                         expected_tau=True)
    exp, got = st["expected_accept_lengths"], st["accept_lengths"]
    assert len(exp) == len(got) == st["decoding_steps"]
    assert exp[:-1] == [float(a) for a in got[:-1]]  # the last cycle may be trimmed at max_new_tokens
    assert exp[-1] >= got[-1]
    _, plain = m.eagenerate(IDS, temperature=0.0, max_new_tokens=40, tree_choices="mc_sim_7b_63", return_stats=True)
    assert "expected_accept_lengths" not in plain


@pytest.mark.parametrize("verifier", ["rrsw", "traversal", "greedy", "univer"])
def test_expected_tau_keeps_the_output_and_is_in_range(verifier):
    m = tiny_ea_model(vocab_size=32, seed=1, aligned=True)
    a, st = m.eagenerate(IDS, temperature=1.0, max_new_tokens=30, tree_choices="2x5", verifier=verifier, seed=4,
                         return_stats=True, expected_tau=True)
    b = m.eagenerate(IDS, temperature=1.0, max_new_tokens=30, tree_choices="2x5", verifier=verifier, seed=4)
    assert a.tolist() == b.tolist()  # computing the law draws no random numbers
    assert len(st["expected_accept_lengths"]) == st["decoding_steps"]
    assert all(1.0 - 1e-6 <= e <= 6.0 + 1e-6 for e in st["expected_accept_lengths"])


@pytest.mark.parametrize("verifier", ["rrsw", "univer"])
def test_tree_laws_expected_tau_matches_sampled_accept_lengths(verifier):
    m = tiny_ea_model(vocab_size=32, seed=1, aligned=True)
    v = get_verifier(verifier)
    g = torch.Generator().manual_seed(0)
    laws = m.tree_laws(IDS, tree_choices="2x5", drafting=v.drafting, temperature=1.0, generator=g)
    n = laws.parents.numel()
    assert laws.tokens[0].item() == IDS[0, -1].item() and laws.parents[0].item() == -1
    assert laws.target_probs.shape == laws.draft_probs.shape == (n, 32)
    assert torch.allclose(laws.target_probs.sum(-1), torch.ones(n), atol=1e-5)
    law = v.outcome_probs(laws.parents, laws.tokens, laws.target_probs, laws.draft_probs)
    expected = float(((laws.depth + 1).float() * law.sum(-1)).sum())
    draws = [v.verify(laws.parents, laws.tokens, laws.target_probs, laws.draft_probs, generator=g)[0]
             for _ in range(3000)]
    mean = sum(int(laws.depth[i]) + 1 for i in draws) / len(draws)
    sd = float(torch.tensor([float(laws.depth[i]) + 1 for i in draws]).std())
    assert abs(mean - expected) <= 5 * sd / math.sqrt(len(draws)) + 2e-3


def test_tree_laws_leaves_the_model_clean_and_is_reproducible():
    m = tiny_ea_model(vocab_size=32, seed=1, aligned=True)
    before = m.eagenerate(IDS, temperature=1.0, max_new_tokens=15, tree_choices="2x5", seed=2)
    a = m.tree_laws(IDS, tree_choices="mc_sim_7b_63", temperature=0.7, generator=torch.Generator().manual_seed(5))
    b = m.tree_laws(IDS, tree_choices="mc_sim_7b_63", temperature=0.7, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.target_probs, b.target_probs)
    assert m.eagenerate(IDS, temperature=1.0, max_new_tokens=15, tree_choices="2x5", seed=2).tolist() == before.tolist()
    with pytest.raises(ValueError, match="at least 2 tokens"):
        m.tree_laws(torch.tensor([[3]]))
    with pytest.raises(ValueError, match="drafting rule"):
        m.tree_laws(IDS, drafting="beam")


def test_progress_hook_counts_every_token():
    m = tiny_ea_model(vocab_size=32, seed=1, aligned=True)
    seen = []
    out = m.eagenerate(IDS, temperature=1.0, max_new_tokens=17, tree_choices="2x5", seed=1, progress=seen.append)
    assert sum(seen) == out.shape[1] - IDS.shape[1] == 17
    seen.clear()
    m.naivegenerate(IDS, max_new_tokens=5, progress=seen.append)
    assert seen == [1] * 5


def test_part_timer_cuda_event_bookkeeping(monkeypatch):
    """The CUDA path of the timer (events read once at the end), run with stand-in events on the CPU."""

    from eagle.model.ea_model import PartTimer

    clock = [0.0]

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = clock[0]

        def elapsed_time(self, end):
            return (end.t - self.t) * 1e3  # milliseconds, as torch.cuda.Event

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    timer = PartTimer("cpu")
    timer.cuda = True
    timer.start()
    for part, dt in [("target_forward", 2.0), ("target_laws", 0.5)]:
        clock[0] += dt
        timer.lap(part)
    timer.since_start()
    clock[0] += 1.0
    timer.lap("draft")
    timer.pause()
    clock[0] += 4.0  # excluded (expected tau)
    timer.resume()
    clock[0] += 0.25
    timer.lap("verify")
    out = timer.result(wall=9.0)
    assert out["target_forward"] == 2.0 and out["target_laws"] == 0.5 and out["draft"] == 1.0
    assert out["verify"] == 0.25 and timer.excluded == 4.0 and timer.split == 2.5
    assert out["other"] == 9.0 - 4.0 - 3.75
