"""Tree attention on the CPU with grouped-query attention in the kernel: same numbers as transformers' sdpa."""
import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from eagle.model.cpu_attention import CPU_TREE_SDPA, cpu_tree_sdpa, register
from eagle.model.kv_cache import new_cache
from eagle.model.packed_linear import packing_available
from eagle.testing import tiny_ea_model
from eagle.tree import build_tree


class _Attn(torch.nn.Module):
    def __init__(self, groups):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _tree_mask(n, past, g):
    vis = torch.rand(n, n, generator=g) < 0.5
    vis = vis.tril() | torch.eye(n, dtype=torch.bool)
    mask = torch.zeros(1, 1, n, past + n)
    mask[..., past:].masked_fill_(~vis, torch.finfo(torch.float32).min)
    return mask


@pytest.mark.parametrize("n,past,groups", [(1, 7, 3), (5, 40, 3), (12, 300, 3), (4, 9, 2), (3, 6, 1)])
def test_equals_transformers_sdpa_under_a_tree_mask(n, past, groups):
    g = torch.Generator().manual_seed(n * 100 + past)
    kv, d = 2, 16
    q = torch.randn(1, kv * groups, n, d, generator=g)
    k, v = torch.randn(1, kv, past + n, d, generator=g), torch.randn(1, kv, past + n, d, generator=g)
    mask = _tree_mask(n, past, g)
    mod = _Attn(groups)
    ref, _ = sdpa_attention_forward(mod, q, k, v, mask, scaling=d ** -0.5)
    out, w = cpu_tree_sdpa(mod, q, k, v, mask, scaling=d ** -0.5)
    assert w is None and out.shape == ref.shape == (1, n, kv * groups, d) and out.is_contiguous()
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    # no mask, or gradients: transformers' own function, the same call
    a, _ = cpu_tree_sdpa(mod, q, k, v, None)
    assert torch.equal(a, sdpa_attention_forward(mod, q, k, v, None)[0])
    qg = q.clone().requires_grad_(True)
    out_g, _ = cpu_tree_sdpa(mod, qg, k, v, mask, scaling=d ** -0.5)
    assert torch.equal(out_g, sdpa_attention_forward(mod, qg, k, v, mask, scaling=d ** -0.5)[0])
    out_g.sum().backward()
    assert qg.grad is not None


def test_register_is_idempotent_and_public():
    from transformers import AttentionInterface, AttentionMaskInterface

    assert register() == register() == CPU_TREE_SDPA
    assert CPU_TREE_SDPA in AttentionInterface._global_mapping and CPU_TREE_SDPA in AttentionMaskInterface._global_mapping


@pytest.mark.skipif(not packing_available(), reason="the fast-CPU switch needs oneDNN packed linears")
def test_fast_cpu_switch_moves_target_and_head_and_back():
    m = tiny_ea_model(vocab_size=32, seed=4)
    tree = build_tree("mc_sim_7b_63")
    ids = torch.randint(0, 32, (1, 30), generator=torch.Generator().manual_seed(2))
    nodes = torch.randint(0, 32, (1, tree.num_nodes), generator=torch.Generator().manual_seed(3))

    def tree_forward():
        cache = new_cache(m.base_model.config)
        m.target_forward(ids, torch.arange(30)[None], cache)
        pos = (30 + tree.depth)[None]
        return m.target_forward(nodes, pos, cache, attention_mask=tree.additive_mask(30))

    m.set_fast_cpu(False)
    assert m.base_model.config._attn_implementation == "sdpa" == m.ea_layer.config._attn_implementation
    ref = tree_forward()
    assert m.set_fast_cpu(True)
    assert m.base_model.config._attn_implementation == CPU_TREE_SDPA == m.ea_layer.config._attn_implementation
    out = tree_forward()
    for a, b in zip(ref, out):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-5)
    m.set_fast_cpu(False)
    assert m.base_model.config._attn_implementation == "sdpa" == m.ea_layer.config._attn_implementation
