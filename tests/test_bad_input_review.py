"""Regression tests from a bad-input review.

The project's rule: bad input gets a clear ``ValueError`` naming what is wrong, never a silent
wrong answer, NaN or an out-of-vocabulary token. Each test pins
a case found by the review (all fixed).
"""
import json

import pytest
import torch

import univer_patch
from eagle.sampling import SamplingConfig, logits_to_probs
from eagle.testing import tiny_ea_model
from eagle.verify.checks import check_tree_inputs, sum_tolerance
from evaluation.questions import load_questions

METHODS = ["rrsw", "traversal", "greedy", "univer"]
V = 32
IDS = torch.tensor([[1, 2, 3, 4]])


@pytest.fixture(scope="module")
def model():
    return tiny_ea_model(vocab_size=V, aligned=True)


def _new(m, out):
    return out[0, IDS.shape[1]:].tolist()


# ---------------------------------------------------------------- already right (pin them)
@pytest.mark.parametrize("method", METHODS)
def test_seed_reproducible_at_temperature_1(model, method):
    kw = dict(temperature=1.0, verifier=method, seed=7, max_new_tokens=12, tree_choices="2x3")
    assert torch.equal(model.eagenerate(IDS, **kw), model.eagenerate(IDS, **kw))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kw", [dict(top_k=1, tree_choices="2x5"), dict(top_p=1e-6, tree_choices="3x3")])
def test_degenerate_draft_law_prunes_children(model, method, kw):
    out = model.eagenerate(IDS, temperature=1.0, verifier=method, seed=0, max_new_tokens=8, **kw)
    new = _new(model, out)
    assert len(new) == 8 and all(0 <= t < V for t in new)


@pytest.mark.parametrize("method", METHODS)
def test_nan_target_row_raises_naming_node(method):
    parents, tokens = torch.tensor([-1, 0]), torch.tensor([0, 1])
    T = torch.full((2, 4), 0.25)
    T[1, 2] = float("nan")
    D = torch.full((2, 4), 0.25)
    with pytest.raises(ValueError, match="node 1"):
        univer_patch.outcome_probs(method, parents, tokens, T, D)


# ---------------------------------------------------------------- open bugs
@pytest.mark.parametrize("bad", [V, -1])
def test_prompt_id_out_of_vocab_raises_valueerror(model, bad):
    with pytest.raises(ValueError):
        model.eagenerate(torch.tensor([[1, bad]]), max_new_tokens=2)


def test_float_prompt_ids_rejected(model):
    with pytest.raises(ValueError):
        model.eagenerate(torch.tensor([[1.7, 2.2]]), max_new_tokens=2)


def test_fractional_max_new_tokens_never_exceeded(model):
    try:
        out = model.eagenerate(IDS, max_new_tokens=2.5, tree_choices="2x3")
    except ValueError:
        return
    assert len(_new(model, out)) <= 2


def test_fractional_top_k_rejected():
    with pytest.raises(ValueError):
        SamplingConfig(1.0, 1.0, 1.7)


def test_infinite_temperature_rejected():
    with pytest.raises(ValueError):
        SamplingConfig(float("inf"))


def test_tiny_temperature_never_nan():
    try:
        p = logits_to_probs(torch.tensor([[10.0, 1.0, -3.0]]), SamplingConfig(1e-39))
    except ValueError:
        return
    assert torch.isfinite(p).all() and torch.allclose(p.sum(-1), torch.ones(1))


@pytest.mark.parametrize("val", [float("nan"), float("inf")])
def test_nonfinite_draft_head_at_temperature_0(val):
    m = tiny_ea_model(vocab_size=V, aligned=True)
    with torch.no_grad():
        m.ea_layer.fc.weight.fill_(val)
    try:
        out = m.eagenerate(IDS, temperature=0.0, max_new_tokens=6, tree_choices="2x3")
    except ValueError:
        return
    assert torch.equal(out, m.naivegenerate(IDS, temperature=0.0, max_new_tokens=6))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tree_wider_than_vocab_is_pruned(model, temperature):
    out = model.eagenerate(IDS, temperature=temperature, seed=0, max_new_tokens=4, tree_choices=f"{V + 1}x1")
    assert all(0 <= t < V for t in _new(model, out))


@pytest.mark.parametrize("choices", [[[0.5]], [[0], [1.9]], [["0"]], []])
def test_invalid_tree_choices_raise(model, choices):
    with pytest.raises(ValueError):
        model.eagenerate(IDS, max_new_tokens=2, tree_choices=choices)


@pytest.mark.parametrize("method", METHODS)
def test_bool_tokens_raise_valueerror(method):
    T = torch.full((2, 4), 0.25)
    with pytest.raises(ValueError, match="tokens"):
        univer_patch.verify(method, torch.tensor([-1, 0]), torch.tensor([False, True]), T, T.clone())


def test_univer_accepts_small_int_dtypes():
    T = torch.full((2, 4), 0.25)
    ref = univer_patch.outcome_probs("univer", torch.tensor([-1, 0]), torch.tensor([0, 1]), T, T.clone())
    got = univer_patch.outcome_probs("univer", torch.tensor([-1, 0], dtype=torch.int8),
                                     torch.tensor([0, 1], dtype=torch.int8), T, T.clone())
    assert torch.allclose(ref, got)


def test_fp16_row_sum_checked_at_documented_tolerance():
    """float16 rows are summed in float32 and checked at float16's tolerance (its epsilon, 9.8e-4)."""
    assert sum_tolerance(torch.float16) == pytest.approx(9.765625e-4)
    off = torch.tensor([0.25, 0.25, 0.25, 0.2515], dtype=torch.float16)  # exact sum 1.0015
    assert abs(float(off.double().sum()) - 1) > 1e-3
    T = torch.stack([off, off])
    with pytest.raises(ValueError, match="sums to"):
        check_tree_inputs(torch.tensor([-1, 0]), torch.tensor([0, 1]), T, T.clone())
    near = torch.tensor([0.25, 0.25, 0.25, 0.2503], dtype=torch.float16)  # exact sum 1.000244: fp16 rounding
    check_tree_inputs(torch.tensor([-1, 0]), torch.tensor([0, 1]), torch.stack([near, near]), torch.stack([near, near]))
    # 4096 entries of 1/4096: a float16 accumulator would stall at 2048 * 2^-12 = 0.5; float32 gives 1
    flat = torch.full((2, 4096), 1 / 4096, dtype=torch.float16)
    check_tree_inputs(torch.tensor([-1, 0]), torch.tensor([0, 1]), flat, flat.clone())


def _write(tmp_path, objs_or_lines):
    p = tmp_path / "q.jsonl"
    p.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in objs_or_lines) + "\n")
    return p


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    good = {"question_id": 1, "category": "qa", "turns": ["hi"]}
    p = _write(tmp_path, [good, good, "{not json"])
    with pytest.raises(ValueError, match=r"q\.jsonl:3"):
        load_questions(p)


@pytest.mark.parametrize("turns", ["hello", []])
def test_bad_turns_rejected(tmp_path, turns):
    p = _write(tmp_path, [{"question_id": 1, "category": "qa", "turns": turns}])
    with pytest.raises(ValueError, match="turns"):
        load_questions(p)
