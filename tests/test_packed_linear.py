"""Fast CPU linears (oneDNN pre-packed weights): same numbers within float rounding, lossless decoding."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from eagle.model.packed_linear import PackedLinear, pack_linears, packed_rows, packing_available, unpack_linears
from eagle.testing import tiny_ea_model

from test_e2e_law import N_RUNS, P_MIN, PROMPT, empirical, exact_two_token_law, model as law_model, p_value

pytestmark = pytest.mark.skipif(not packing_available(), reason="oneDNN packed linears unavailable here")


def test_packed_linear_matches_f_linear():
    g = torch.Generator().manual_seed(0)
    for bias in (True, False):
        lin = nn.Linear(48, 80, bias=bias)
        p = PackedLinear(lin)
        assert p.weight is lin.weight
        for shape in ((1, 48), (5, 48), (1, 7, 48), (2, 3, 48)):
            x = torch.randn(*shape, generator=g)
            with torch.no_grad():
                torch.testing.assert_close(p(x), F.linear(x, lin.weight, lin.bias), atol=1e-4, rtol=1e-5)


def test_grad_mode_falls_back_to_eager():
    lin = nn.Linear(8, 4)
    p = PackedLinear(lin)
    x = torch.randn(3, 8)
    p(x).sum().backward()
    assert lin.weight.grad is not None


def test_pack_unpack_keeps_state_dict():
    m = tiny_ea_model(vocab_size=32)
    keys = set(m.state_dict())
    n = pack_linears(m.base_model)
    assert n == sum(1 for x in m.base_model.modules() if isinstance(x, PackedLinear)) > 0
    assert set(m.state_dict()) == keys
    assert unpack_linears(m.base_model) == n
    assert not any(isinstance(x, PackedLinear) for x in m.modules())
    with pytest.raises(ValueError, match="float32"):
        PackedLinear(nn.Linear(4, 4).double())
    assert packed_rows(torch.randn(5, 4).double()) is None


def test_fast_cpu_logits_close_to_eager():
    from eagle.model.kv_cache import new_cache

    m = tiny_ea_model(vocab_size=64, seed=3)
    ids = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(1))
    ref = m.target_forward(ids, torch.arange(20)[None], new_cache(m.base_model.config))
    assert m.set_fast_cpu(True)
    assert isinstance(m.lm_head, PackedLinear) and m.drafter.lm_head is m.lm_head
    out = m.target_forward(ids, torch.arange(20)[None], new_cache(m.base_model.config))
    for a, b in zip(ref, out):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-5)
    assert not m.set_fast_cpu(False)
    assert not any(isinstance(x, PackedLinear) for x in m.modules())


@pytest.mark.parametrize("draft_vocab", [False, True])
def test_temperature_zero_equals_greedy_with_fast_cpu(draft_vocab):
    m = tiny_ea_model(vocab_size=32, seed=5, aligned=True)
    m.set_fast_cpu(True)
    if draft_vocab:
        m.ea_layer.set_draft_vocab(torch.arange(0, 32, 2))
    prompt = torch.tensor([[1, 4, 9]])
    ref = m.naivegenerate(prompt, temperature=0.0, max_new_tokens=24)
    for tree in ("mc_sim_7b_63", "2x3", "chain4"):
        assert torch.equal(m.eagenerate(prompt, temperature=0.0, max_new_tokens=24, tree_choices=tree), ref)
    if draft_vocab:
        assert m.drafter._draft_rows[2] is not None  # the draft-vocabulary rows are packed too


@pytest.mark.parametrize("method", [pytest.param("rrsw", marks=pytest.mark.slow), "univer"])
def test_first_two_tokens_follow_target_with_fast_cpu(method):
    m = law_model()
    assert m.set_fast_cpu(True)
    law = exact_two_token_law(m)  # the packed model's own law
    counts = empirical(m, method, N_RUNS, "2x2")
    assert p_value(counts, law) > P_MIN


def test_from_pretrained_turns_fast_cpu_on_for_a_float32_cpu_target(tmp_path):
    from eagle.model.ea_model import EaModel

    m = tiny_ea_model(vocab_size=32, seed=2)
    m.base_model.save_pretrained(tmp_path / "base")
    m.ea_layer.save_pretrained(tmp_path / "head")
    loaded = EaModel.from_pretrained(str(tmp_path / "base"), str(tmp_path / "head"))
    assert loaded.fast_cpu and isinstance(loaded.lm_head, PackedLinear)
    off = EaModel.from_pretrained(str(tmp_path / "base"), str(tmp_path / "head"), fast_cpu=False)
    assert not off.fast_cpu and not any(isinstance(x, PackedLinear) for x in off.modules())
