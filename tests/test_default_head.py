"""The shipped EAGLE-1 head for the default model (SmolLM2-135M-Instruct) loads with the right shapes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eagle.model.default import DEFAULT_HEAD

HEAD = Path(DEFAULT_HEAD)
H, V, I = 576, 49152, 1536


@pytest.fixture(scope="module")
def head_folder():
    if not (HEAD / "config.json").exists() or not (HEAD / "model.safetensors").exists():
        pytest.skip(f"no shipped head at {HEAD} (config.json + model.safetensors); train it with scripts/train_head.sh")
    return HEAD


def test_shipped_head_files(head_folder):
    from safetensors.torch import load_file

    cfg = json.load(open(head_folder / "config.json"))
    assert cfg["num_hidden_layers"] == 2 and cfg["hidden_size"] == H and cfg["vocab_size"] == V
    state = load_file(str(head_folder / "model.safetensors"))
    assert "embed_tokens.weight" not in state
    assert all(t.dtype == torch.float16 for t in state.values())
    assert all(torch.isfinite(t.float()).all() for t in state.values())
    assert (head_folder / "model.safetensors").stat().st_size < 20 * 2 ** 20


def test_shipped_head_loads_with_target_embedding(head_folder):
    from eagle.model.head import EagleHead

    emb = torch.nn.Embedding(V, H)
    head = EagleHead.from_pretrained(head_folder, embedding=emb)
    assert head.embed_tokens is emb
    assert tuple(head.fc.weight.shape) == (H, 2 * H) and tuple(head.fc.bias.shape) == (H,)
    assert len(head.layers) == 2 and tuple(head.layers[1].input_layernorm.weight.shape) == (H,)
    layer = head.layers[0]
    assert tuple(layer.self_attn.q_proj.weight.shape) == (H, H)
    assert tuple(layer.self_attn.k_proj.weight.shape) == (192, H)   # 3 KV heads x 64
    assert tuple(layer.self_attn.v_proj.weight.shape) == (192, H)
    assert tuple(layer.self_attn.o_proj.weight.shape) == (H, H)
    assert tuple(layer.mlp.gate_proj.weight.shape) == (I, H)
    assert tuple(layer.mlp.down_proj.weight.shape) == (H, I)
    assert tuple(layer.post_attention_layernorm.weight.shape) == (H,)
    with torch.no_grad():
        y = head(torch.tensor([[1, 2, 3]]), torch.randn(1, 3, H))
    assert y.shape == (1, 3, H) and torch.isfinite(y).all()
