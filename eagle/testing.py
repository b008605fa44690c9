"""Tiny randomly initialised target + head, for tests and examples (no download, CPU, ~1 s)."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from .model.ea_model import EaModel
from .model.head import EagleHead, head_config_from_base

__all__ = ["tiny_llama_config", "tiny_ea_model"]


def tiny_llama_config(vocab_size: int = 32, hidden_size: int = 32, num_layers: int = 2,
                      attn_implementation: str = "sdpa", eos_token_id: int | None = None) -> LlamaConfig:
    """A small LlamaConfig (4 heads, 2 KV heads, float32)."""
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      bos_token_id=0, eos_token_id=eos_token_id, pad_token_id=None)
    cfg._attn_implementation = attn_implementation
    return cfg


def tiny_ea_model(vocab_size: int = 32, hidden_size: int = 32, num_layers: int = 2, seed: int = 0,
                  logit_scale: float = 4.0, attn_implementation: str = "sdpa", eos_token_id: int | None = None,
                  tree_choices="mc_sim_7b_63", verifier: str = "rrsw", aligned: bool = False,
                  align_shrink: float = 0.3, head_layers: int = 1) -> EaModel:
    """An :class:`EaModel` with a random tiny Llama target and a random head sharing its embeddings.

    ``logit_scale`` multiplies the lm_head weights so the target's laws are peaked rather than
    near-uniform (more interesting acceptance). Weights are float32, on CPU, seeded by ``seed``.

    ``aligned=True`` makes the draft head a good (not perfect) predictor, so that deep paths get
    accepted: the target's attention/MLP outputs are shrunk (its next token depends mostly on the
    current token; ``align_shrink`` scales them) and the head's ``fc`` passes the embedding of its input token through.

    ``head_layers`` sets the head's decoder layers (EAGLE-1: 1).
    """
    torch.manual_seed(seed)
    cfg = tiny_llama_config(vocab_size, hidden_size, num_layers, attn_implementation, eos_token_id)
    base = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        base.lm_head.weight.mul_(logit_scale / (base.lm_head.weight.std() * hidden_size ** 0.5))
    hcfg = head_config_from_base(cfg, layers=head_layers)
    hcfg._attn_implementation = attn_implementation
    head = EagleHead(hcfg, with_embeddings=False)
    head.tie_embeddings(base.get_input_embeddings())
    if aligned:
        with torch.no_grad():
            for layer in list(base.model.layers) + list(head.layers):
                layer.self_attn.o_proj.weight.mul_(align_shrink)
                layer.mlp.down_proj.weight.mul_(align_shrink)
            head.fc.weight.zero_()
            head.fc.weight[:, :hidden_size].copy_(torch.eye(hidden_size))
            head.fc.bias.zero_()
    head.eval()
    return EaModel(base, head, tokenizer=None, tree_choices=tree_choices, verifier=verifier)
