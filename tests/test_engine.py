"""Engine tests (issue 2): tree decoding exactness, KV cache, stopping, head checkpoints."""
import json

import pytest
import torch

from eagle.model import ea_model as ea_module
from eagle.model.head import CheckpointMismatchError, EagleHead
from eagle.model.kv_cache import new_cache
from eagle.testing import tiny_ea_model
from eagle.tree import build_tree

TREES = ["mc_sim_7b_63", "2x5", "3x3", "chain4"]
PROMPTS = [[1, 2, 3, 4, 5], [7], [3, 9, 9, 2, 30, 17, 4, 11]]


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("aligned", [False, True])
def test_greedy_equals_naive(tree, seed, aligned):
    m = tiny_ea_model(vocab_size=32, seed=seed, aligned=aligned)
    _assert_greedy_equals_naive(m, tree)


@pytest.mark.parametrize("tree", ["mc_sim_7b_63", "2x5"])
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_equals_naive_with_a_two_layer_head(tree, seed):
    m = tiny_ea_model(vocab_size=32, seed=seed, aligned=True, head_layers=2)
    assert len(m.ea_layer.layers) == 2
    _assert_greedy_equals_naive(m, tree)


def _assert_greedy_equals_naive(m, tree):
    for p in PROMPTS:
        ids = torch.tensor([p])
        ref = m.naivegenerate(ids, max_new_tokens=30)
        out, st = m.eagenerate(ids, max_new_tokens=30, tree_choices=tree, return_stats=True)
        assert out.tolist() == ref.tolist()
        assert st["new_tokens"] == 30 and sum(st["accept_lengths"]) + 1 == 30
        assert st["decoding_steps"] == len(st["accept_lengths"])


def test_aligned_model_accepts_deep_paths():
    # guard: the equality tests above must exercise multi-token acceptance, not only tau = 1
    m = tiny_ea_model(vocab_size=32, seed=1, aligned=True)
    _, st = m.eagenerate(torch.tensor([PROMPTS[0]]), max_new_tokens=40, tree_choices="2x5", return_stats=True)
    assert max(st["accept_lengths"]) >= 3


def test_forced_tie_broken_like_naive():
    m = tiny_ea_model(vocab_size=32, seed=3, aligned=True)
    with torch.no_grad():  # every token's logit ties with its twin: argmax must pick the lower id in both
        w = m.base_model.lm_head.weight
        w[16:] = w[:16]
    for tree in TREES:
        ids = torch.tensor([[1, 2, 3]])
        ref = m.naivegenerate(ids, max_new_tokens=25)
        assert (ref[0, 3:] < 16).all()
        assert m.eagenerate(ids, max_new_tokens=25, tree_choices=tree).tolist() == ref.tolist()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("tree", ["mc_sim_7b_63", "3x3"])
def test_tree_forward_matches_sequential(attn, tree):
    m = tiny_ea_model(vocab_size=32, seed=0, attn_implementation=attn)
    t = build_tree(tree)
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 32, (1, 7), generator=g)
    tokens = torch.randint(0, 32, (t.num_nodes,), generator=g)
    cache = new_cache(m.base_model.config)
    m.target_forward(prefix, torch.arange(7)[None], cache)
    mask = t.additive_mask(7)
    _, tree_logits = m.target_forward(tokens[None], (7 + t.depth)[None], cache, attention_mask=mask)
    for i in range(t.num_nodes):
        anc = torch.nonzero(t.ancestor_mask[i]).flatten()
        seq = torch.cat([prefix[0], tokens[anc]])[None]
        _, ref = m.target_forward(seq, torch.arange(seq.shape[1])[None], new_cache(m.base_model.config))
        assert (tree_logits[0, i] - ref[0, -1]).abs().max() <= 1e-4


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_kv_cache_equals_fresh_prefill(monkeypatch, temperature):
    m = tiny_ea_model(vocab_size=32, seed=1, aligned=True)
    snapshots = []
    original = ea_module.keep_positions

    def spy(cache, start, keep):
        original(cache, start, keep)
        snapshots.append([(l.keys.clone(), l.values.clone()) for l in cache.layers])

    monkeypatch.setattr(ea_module, "keep_positions", spy)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    out = m.eagenerate(ids, temperature=temperature, max_new_tokens=30, tree_choices="2x5", verifier="rrsw", seed=0)
    assert len(snapshots) >= 3
    for layers in snapshots:
        length = layers[0][0].shape[-2]
        fresh = new_cache(m.base_model.config)
        m.target_forward(out[:, :length], torch.arange(length)[None], fresh)
        for (k, v), fl in zip(layers, fresh.layers):
            assert (k - fl.keys).abs().max() <= 1e-4 and (v - fl.values).abs().max() <= 1e-4


def test_eos_inside_accepted_block_stops_there():
    m = tiny_ea_model(vocab_size=32, seed=1, aligned=True)
    ids = torch.tensor([PROMPTS[0]])
    ref = m.naivegenerate(ids, max_new_tokens=40)[0, ids.shape[1]:].tolist()
    inside = 0
    for eos in sorted(set(ref[3:])):
        first = ref.index(eos)
        m.base_model.config.eos_token_id = eos
        out, st = m.eagenerate(ids, max_new_tokens=40, tree_choices="2x5", return_stats=True)
        assert out[0, ids.shape[1]:].tolist() == ref[: first + 1]
        assert st["new_tokens"] == first + 1 and sum(st["accept_lengths"]) + 1 == first + 1
        naive = m.naivegenerate(ids, max_new_tokens=40)
        assert naive.tolist() == out.tolist()
        inside += st["accept_lengths"][-1] > 1  # stopped within a multi-token block
    m.base_model.config.eos_token_id = None
    assert inside >= 1


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_max_new_tokens_exact(n, temperature):
    m = tiny_ea_model(vocab_size=32, seed=1, aligned=True)
    ids = torch.tensor([PROMPTS[0]])
    out, st = m.eagenerate(ids, temperature=temperature, max_new_tokens=n, tree_choices="2x5", seed=0,
                           return_stats=True)
    assert out.shape[1] == ids.shape[1] + n and st["new_tokens"] == n
    if temperature == 0:
        assert out.tolist() == m.naivegenerate(ids, max_new_tokens=n).tolist()


def test_bad_inputs():
    m = tiny_ea_model(vocab_size=32)
    with pytest.raises(ValueError, match="batch size 1"):
        m.eagenerate(torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="empty prompt"):
        m.eagenerate(torch.ones(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="max_new_tokens"):
        m.eagenerate(torch.ones(1, 3, dtype=torch.long), max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        m.eagenerate(torch.ones(1, 3, dtype=torch.long), temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        m.eagenerate(torch.ones(1, 3, dtype=torch.long), temperature=1, top_p=0)
    with pytest.raises(ValueError, match="unknown verifier"):
        m.eagenerate(torch.ones(1, 3, dtype=torch.long), temperature=1, verifier="nope")
    with pytest.raises(ValueError, match="unknown tree"):
        m.eagenerate(torch.ones(1, 3, dtype=torch.long), tree_choices="weird")
    with torch.no_grad():
        m.base_model.lm_head.weight[3, 0] = float("nan")
    for t in (0.0, 1.0):
        with pytest.raises(ValueError, match="NaN or inf"):
            m.eagenerate(torch.ones(1, 3, dtype=torch.long), temperature=t, max_new_tokens=5)


# ---------------------------------------------------------------- head checkpoints
def _public_layout(tmp_path, head, fmt):
    folder = tmp_path / fmt
    head.save_pretrained(folder, dtype=torch.float32, include_embeddings=True)
    if fmt == "bin":
        from safetensors.torch import load_file

        state = load_file(str(folder / "model.safetensors"))
        (folder / "model.safetensors").unlink()
        torch.save(state, folder / "pytorch_model.bin")
    return folder


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_head_public_layout_loads(tmp_path, fmt):
    m = tiny_ea_model(vocab_size=32, seed=0)
    folder = _public_layout(tmp_path, m.ea_layer, fmt)
    from safetensors.torch import load_file

    keys = set(torch.load(folder / "pytorch_model.bin") if fmt == "bin" else load_file(str(folder / "model.safetensors")))
    assert keys == {"embed_tokens.weight", "fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight",
                    "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight",
                    "layers.0.self_attn.o_proj.weight", "layers.0.mlp.gate_proj.weight",
                    "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight",
                    "layers.0.post_attention_layernorm.weight"}
    head = EagleHead.from_pretrained(folder)
    for k, v in m.ea_layer.state_dict().items():
        assert torch.equal(head.state_dict()[k], v), k


def test_head_without_embeddings_and_bias_false(tmp_path):
    m = tiny_ea_model(vocab_size=32, seed=0)
    m.ea_layer.save_pretrained(tmp_path / "h", dtype=torch.float32)
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 1 and cfg["bias"] is True
    with pytest.raises(CheckpointMismatchError, match="no embed_tokens"):
        EagleHead.from_pretrained(tmp_path / "h")
    head = EagleHead.from_pretrained(tmp_path / "h", embedding=m.base_model.get_input_embeddings())
    assert head.embed_tokens is m.base_model.get_input_embeddings()
    # a bias-free head (config "bias": false) must not expect fc.bias
    from safetensors.torch import load_file, save_file

    state = load_file(str(tmp_path / "h" / "model.safetensors"))
    del state["fc.bias"]
    save_file(state, str(tmp_path / "h" / "model.safetensors"))
    cfg["bias"] = False
    (tmp_path / "h" / "config.json").write_text(json.dumps(cfg))
    head = EagleHead.from_pretrained(tmp_path / "h", embedding=m.base_model.get_input_embeddings())
    assert head.fc.bias is None


def test_head_checkpoint_mismatch_names_the_key(tmp_path):
    from safetensors.torch import load_file, save_file

    m = tiny_ea_model(vocab_size=32, seed=0)
    folder = _public_layout(tmp_path, m.ea_layer, "safetensors")
    good = load_file(str(folder / "model.safetensors"))
    bad = dict(good)
    bad["layers.0.mlp.up_proj.weight"] = bad["layers.0.mlp.up_proj.weight"][:, :-1].contiguous()
    save_file(bad, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointMismatchError, match="layers.0.mlp.up_proj.weight"):
        EagleHead.from_pretrained(folder)
    bad = dict(good)
    bad["layers.0.self_attn.q_proj.wieght"] = bad.pop("layers.0.self_attn.q_proj.weight")
    save_file(bad, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointMismatchError, match="q_proj.wieght"):
        EagleHead.from_pretrained(folder)
    bad = dict(good)
    del bad["fc.weight"]
    save_file(bad, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointMismatchError, match="missing key 'fc.weight'"):
        EagleHead.from_pretrained(folder)


def test_two_layer_head_layout_round_trip_and_bad_layer_counts(tmp_path):
    """A head with num_hidden_layers = 2 saves and loads in EAGLE-1's own layout: layer 0 without an
    input layernorm, layer 1 with one; a config with 0 or a non-integer layer count is refused."""
    from safetensors.torch import load_file

    m = tiny_ea_model(vocab_size=32, seed=0, head_layers=2)
    m.ea_layer.save_pretrained(tmp_path / "h", dtype=torch.float32, include_embeddings=True)
    keys = set(load_file(str(tmp_path / "h" / "model.safetensors")))
    assert "layers.1.input_layernorm.weight" in keys and "layers.0.input_layernorm.weight" not in keys
    assert {k.split(".")[1] for k in keys if k.startswith("layers.")} == {"0", "1"}
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2
    head = EagleHead.from_pretrained(tmp_path / "h")
    ids, feats = torch.randint(0, 32, (1, 6)), torch.randn(1, 6, 32)
    torch.testing.assert_close(head(ids, feats), m.ea_layer(ids, feats))
    for bad in (0, "2", None):
        cfg["num_hidden_layers"] = bad
        (tmp_path / "h" / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(CheckpointMismatchError, match="num_hidden_layers"):
            EagleHead.from_pretrained(tmp_path / "h")
    # a one-layer config over two layers' weights names the extra key
    cfg["num_hidden_layers"] = 1
    (tmp_path / "h" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointMismatchError, match="layers.1."):
        EagleHead.from_pretrained(tmp_path / "h")


def test_add_layer_keeps_the_function_and_the_new_layer_trains():
    from eagle.model.head import add_layer

    m = tiny_ea_model(vocab_size=32, seed=2, aligned=True)
    h1 = m.ea_layer
    h2 = add_layer(h1)
    assert len(h2.layers) == 2 and h2.config.num_hidden_layers == 2 and len(h1.layers) == 1
    assert h2.embed_tokens is h1.embed_tokens
    ids, feats = torch.randint(0, 32, (2, 9)), torch.randn(2, 9, 32)
    torch.testing.assert_close(h2(ids, feats), h1(ids, feats), atol=0, rtol=0)
    for k, v in h1.state_dict().items():  # the copy does not alias the old head's own weights
        if not k.startswith("embed_tokens."):
            assert h2.state_dict()[k].data_ptr() != v.data_ptr()
    # the zero branches get gradients, so training can move the new layer off the identity
    h2(ids, feats).square().sum().backward()
    assert h2.layers[1].self_attn.o_proj.weight.grad.abs().sum() > 0
    assert h2.layers[1].mlp.down_proj.weight.grad.abs().sum() > 0


def test_head_target_mismatch(tmp_path):
    from eagle.model.ea_model import EaModel

    a = tiny_ea_model(vocab_size=32, hidden_size=32)
    b = tiny_ea_model(vocab_size=48, hidden_size=32)
    with pytest.raises(CheckpointMismatchError, match="vocab"):
        EaModel(b.base_model, a.ea_layer)


@pytest.mark.parametrize("head_layers", [1, 2])
def test_head_cache_holds_exactly_the_committed_pairs(monkeypatch, head_layers):
    """At every draft call the head cache equals a fresh head pass over the committed
    (embed(x_{t+1}), target feature_t) pairs, in every head layer: draft positions never leak into
    later cycles."""
    m = tiny_ea_model(vocab_size=32, seed=1, aligned=True, head_layers=head_layers)
    seen = []
    original = m.drafter.expand

    def spy(head_cache, *args, **kwargs):
        seen.append([(l.keys.clone(), l.values.clone()) for l in head_cache.layers])
        return original(head_cache, *args, **kwargs)

    monkeypatch.setattr(m.drafter, "expand", spy)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    out = m.eagenerate(ids, temperature=1.0, max_new_tokens=25, tree_choices="2x5", verifier="univer", seed=3)
    assert len(seen) >= 3
    for layers in seen:
        c = layers[0][0].shape[-2]  # committed pairs = committed tokens - 1
        feats, _ = m.target_forward(out[:, :c], torch.arange(c)[None], new_cache(m.base_model.config))
        fresh = new_cache(m.ea_layer.config)
        m.ea_layer(out[:, 1:c + 1], feats, position_ids=torch.arange(c)[None], cache=fresh)
        assert len(layers) == head_layers
        for (k, v), fl in zip(layers, fresh.layers):
            assert (k - fl.keys).abs().max() <= 1e-4 and (v - fl.values).abs().max() <= 1e-4
