"""End to end at temperature > 0: the law of the first 2 generated tokens equals the target's (static trees for
the four verifiers, EAGLE-2 dynamic trees for Greedy and UniVer).

Statistical test with fixed seeds on a tiny vocabulary (8 tokens, 64 outcomes): Pearson
chi-square of the empirical counts of ``eagenerate(max_new_tokens=2)`` against the target's
exact law p(x1 | prompt) p(x2 | prompt, x1); the test fails below p-value 1e-3. A deliberately
broken verifier (RRSw that samples the correction token from the target instead of the residual)
must fail the same test.
"""
import pytest
import torch
from scipy.stats import chisquare

from eagle.model.kv_cache import new_cache
from eagle.testing import tiny_ea_model
from eagle.verify.registry import Verifier

V = 8
PROMPT = torch.tensor([[1, 5, 2]])
TEMPERATURE = 1.0
P_MIN = 1e-3
N_RUNS = 1000


def model():
    return tiny_ea_model(vocab_size=V, hidden_size=32, seed=4, logit_scale=2.5, aligned=True, align_shrink=0.5)


def exact_two_token_law(m):
    from eagle.sampling import SamplingConfig, logits_to_probs

    cfg = SamplingConfig(TEMPERATURE)
    _, logits = m.target_forward(PROMPT, torch.arange(3)[None], new_cache(m.base_model.config))
    p1 = logits_to_probs(logits[0, -1], cfg).double()
    law = torch.zeros(V, V, dtype=torch.float64)
    for x in range(V):
        seq = torch.cat([PROMPT, torch.tensor([[x]])], dim=1)
        _, lg = m.target_forward(seq, torch.arange(4)[None], new_cache(m.base_model.config))
        law[x] = p1[x] * logits_to_probs(lg[0, -1], cfg).double()
    return law


def empirical(m, verifier, n, tree):
    counts = torch.zeros(V, V, dtype=torch.float64)
    for s in range(n):
        out = m.eagenerate(PROMPT, temperature=TEMPERATURE, max_new_tokens=2, tree_choices=tree, verifier=verifier,
                           seed=s)
        counts[out[0, 3], out[0, 4]] += 1
    return counts


def p_value(counts, law):
    """Pearson chi-square p-value; outcomes with expected count < 5 are pooled into one cell."""
    n = counts.sum()
    expected = (law / law.sum() * n).flatten()
    observed = counts.flatten()
    assert observed[expected == 0].sum() == 0, "a sample fell on a zero-probability outcome"
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    return chisquare(obs.numpy(), exp.numpy()).pvalue


def _broken_rrsw_kernel(st, tokens, target_probs, draft_probs, uniforms):
    """RRSw with one deliberate error: after rejecting every child, y ~ M_b instead of the residual."""
    from eagle.sampling import sample_with_uniform

    u = uniforms.tolist()
    node = 0
    while True:
        kids = st.children[node]
        p, q = target_probs[node].double(), draft_probs[node].double().clone()
        moved = False
        for c in kids:
            t = int(tokens[c])
            if u[c][0] < min(1.0, float(p[t] / q[t])):
                node, moved = c, True
                break
            q[t] = 0
            q = q / q.sum()
        if not moved:
            return node, sample_with_uniform(target_probs[node], u[node][1])


BROKEN = Verifier("broken_rrsw", "wor", _broken_rrsw_kernel, lambda *a: None, "negative control")


@pytest.mark.parametrize("method", ["rrsw", "traversal", "greedy", "univer"])
def test_first_two_tokens_follow_target(method):
    m = model()
    law = exact_two_token_law(m)
    counts = empirical(m, method, N_RUNS, "2x2")
    assert p_value(counts, law) > P_MIN


def test_broken_verifier_fails_the_law_test():
    m = model()
    law = exact_two_token_law(m)
    counts = empirical(m, BROKEN, N_RUNS, "2x2")
    assert p_value(counts, law) < P_MIN


DYNAMIC = "eagle2:nodes=4,depth=2,topk=3"


@pytest.mark.parametrize("method", ["greedy", "univer"])
def test_first_two_tokens_follow_target_on_a_dynamic_tree(method, monkeypatch):
    """EAGLE-2 dynamic trees under topk_residual, end to end: the shape chosen from the draft laws, its residual
    leaves drawn on the expansion's own laws, or the shape redrafted by the head where a last child has
    children (both occur here)."""
    from eagle.drafting import EagleTreeDrafter

    paths = []
    redraw = EagleTreeDrafter._redraw_residual_leaves

    def counted(self, *a, **k):
        out = redraw(self, *a, **k)
        paths.append(out is not None)
        return out

    monkeypatch.setattr(EagleTreeDrafter, "_redraw_residual_leaves", counted)
    m = model()
    law = exact_two_token_law(m)
    counts = empirical(m, method, N_RUNS, DYNAMIC)
    assert p_value(counts, law) > P_MIN
    assert 0.1 < sum(paths) / len(paths) < 0.9, "both ways of drafting the shape should occur"


def test_deterministic_last_children_on_a_dynamic_tree_fail_the_law_test(monkeypatch):
    """Negative control: the dynamic shape's last children kept as the expansion's own top tokens (rule topk)
    instead of residual draws, handed to UniVer as a topk_residual tree."""
    from eagle.drafting import EagleTreeDrafter

    draw = EagleTreeDrafter._draw_levels
    monkeypatch.setattr(EagleTreeDrafter, "_draw_levels",
                        lambda self, plan, root, laws, rule, gen: draw(self, plan, root, laws, "topk", gen))
    m = model()
    law = exact_two_token_law(m)
    counts = empirical(m, "univer", N_RUNS, DYNAMIC)
    assert p_value(counts, law) < P_MIN
