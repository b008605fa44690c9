"""The EAGLE-3 draft head in the public checkpoint layout, and its loader.

Architecture (EAGLE-3, Li et al. 2025, "Scaling up Inference Acceleration of Large Language Models via
Training-Time Test"), as the public heads (e.g. ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``) store it:

- ``fc: Linear(3 Ht -> H, no bias)`` fuses three hidden states of the target (low / mid / high: the
  entries ``2``, ``L // 2`` and ``L - 3`` of transformers' ``hidden_states`` for a target of L decoder
  layers, i.e. the inputs of decoder layers 2, L // 2 and L - 3), concatenated in that order;
- ``midlayer``: ONE Llama decoder layer whose attention reads ``2 H`` inputs: the RMS-normed token
  embedding (``input_layernorm``) FIRST, then the RMS-normed hidden state (``hidden_norm``); the
  attention's residual is the hidden state before its norm; then ``post_attention_layernorm``, the MLP
  and its residual as usual;
- ``norm`` (RMSNorm) and the head's own ``lm_head: Linear(H -> K, no bias)`` over a draft vocabulary of
  ``K = draft_vocab_size`` tokens: draft index i is the target token ``i + d2t[i]``; ``t2d`` (bool
  ``[V]``) marks the target tokens that are in the draft vocabulary.

A (token_{t+1}, x_t) pair gives the head output ``h`` (H wide, before ``norm``); the draft law of the
next token is ``softmax(lm_head(norm(h)))`` over the K draft tokens. At the committed positions x_t is
``fc`` of the target's fused features; at deeper draft steps x is the head's own output ``h`` at the
parent (H wide, ``fc`` skipped).

Checkpoint keys (``config.json`` = a LlamaConfig plus ``draft_vocab_size`` and, when the head is narrower
or wider than the target, ``target_hidden_size``; weights in ``model.safetensors`` or ``pytorch_model.bin``):
``fc.weight [H, 3 Ht]``, ``midlayer.hidden_norm.weight [H]``, ``midlayer.input_layernorm.weight [H]``,
``midlayer.post_attention_layernorm.weight [H]``, ``midlayer.self_attn.{q,k,v}_proj.weight [heads * head_dim,
2 H]`` (k, v with the key-value heads), ``midlayer.self_attn.o_proj.weight [H, heads * head_dim]``,
``midlayer.mlp.{gate,up}_proj.weight [I, H]``, ``midlayer.mlp.down_proj.weight [H, I]``, ``norm.weight [H]``,
``lm_head.weight [K, H]``, ``d2t`` (int64 ``[K]``), ``t2d`` (bool ``[V]``), and optionally
``embed_tokens.weight [V, H]`` (otherwise the target's input embedding is used; then H must be the
target's width). ``d2t`` / ``t2d`` may be absent only when K = V (the identity map).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from .head import CheckpointMismatchError
from .kv_cache import cache_kwargs

__all__ = ["Eagle3Head", "Eagle3Layer", "load_eagle3_head", "eagle3_feature_layers", "check_feature_layers",
           "EAGLE3_WEIGHT_FILES"]

EAGLE3_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def eagle3_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """The target hidden states EAGLE-3 fuses, as indices into transformers' ``hidden_states`` tuple
    (0 = the embeddings, i = the output of decoder layer i - 1 = the input of decoder layer i).

    EAGLE-3's modified target collects the hidden state entering decoder layers 2, ``L // 2`` and
    ``L - 3`` (low, mid, high), which are ``hidden_states[2]``, ``[L // 2]`` and ``[L - 3]``.

    Raises:
        ValueError: a target with fewer than 3 decoder layers (``L - 3`` would be negative).
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 3:
        raise ValueError(f"EAGLE-3 fuses the hidden states entering layers 2, L//2 and L-3 of the target, which "
                         f"needs L >= 3 decoder layers; the target has {num_layers!r}")
    return (2, num_layers // 2, num_layers - 3)


def check_feature_layers(layers, num_layers: int | None) -> tuple[int, ...]:
    """``layers`` as a tuple of ints after checking them against a target of ``num_layers`` decoder layers.

    Indices into transformers' ``hidden_states`` (``0 .. num_layers``; ``num_layers`` = after the final norm;
    None = unknown: only ``>= 0`` is checked).

    Raises:
        ValueError: not a non-empty sequence of integers in ``[0, num_layers]`` (one line naming the bad entry).
    """
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
        raise ValueError(f"feature_layers must be a sequence of hidden-state indices, got {layers!r}")
    layers = tuple(layers)
    if not layers:
        raise ValueError("feature_layers must name at least one hidden-state index")
    for i in layers:
        if isinstance(i, bool) or not isinstance(i, int) or i < 0 or (num_layers is not None and i > num_layers):
            raise ValueError(f"feature_layers entry {i!r} is not a hidden-state index of the target, which has "
                             f"{num_layers} decoder layers (valid: 0..{num_layers})")
    return layers


class Eagle3Layer(nn.Module):
    """EAGLE-3's single decoder layer (checkpoint prefix ``midlayer.``): attention over
    ``[input_layernorm(embedding), hidden_norm(hidden)]`` (2 H wide), residual = ``hidden``.

    Args:
        config: the head's LlamaConfig (hidden size H, heads, key-value heads, head_dim, intermediate size,
            ``rms_norm_eps``, ``attention_bias``, ``_attn_implementation``).
    """

    def __init__(self, config: LlamaConfig):
        super().__init__()
        h = config.hidden_size
        self.self_attn = LlamaAttention(config, layer_idx=0)
        bias = bool(getattr(config, "attention_bias", False))
        heads, kv, hd = config.num_attention_heads, config.num_key_value_heads, self.self_attn.head_dim
        # the projections read the 2H concatenation (transformers' attention takes any input width)
        self.self_attn.q_proj = nn.Linear(2 * h, heads * hd, bias=bias)
        self.self_attn.k_proj = nn.Linear(2 * h, kv * hd, bias=bias)
        self.self_attn.v_proj = nn.Linear(2 * h, kv * hd, bias=bias)
        self.mlp = LlamaMLP(config)
        self.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.input_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)

    def forward(self, emb: torch.Tensor, hidden: torch.Tensor, position_embeddings, attention_mask=None,
                cache=None) -> torch.Tensor:
        """Args: emb, hidden: float ``[B, n, H]`` (token embeddings; hidden states); position_embeddings:
        the rotary ``(cos, sin)``; attention_mask: None or a 4D additive float mask ``[B, 1, n, past + n]``;
        cache: the head's ``DynamicCache`` (layer 0) or None. Returns float ``[B, n, H]``."""
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)
        attn, _ = self.self_attn(hidden_states=x, position_embeddings=position_embeddings,
                                 attention_mask=attention_mask, **cache_kwargs(self.self_attn, cache))
        h = hidden + attn
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    """EAGLE-3 draft head (see the module docstring for the architecture and the key names).

    Args:
        config: LlamaConfig of the head (H = ``hidden_size``), with ``draft_vocab_size`` (K) and optionally
            ``target_hidden_size`` (Ht, default H); ``vocab_size`` = the target's V.
        with_embeddings: allocate ``embed_tokens`` (``[V, H]``); otherwise call :meth:`tie_embeddings`.

    Buffers ``d2t`` (int64 ``[K]``) and ``t2d`` (bool ``[V]``) are part of the state dict, as in the
    public checkpoints; :attr:`targets` is the derived map draft index -> target token.
    """

    def __init__(self, config: LlamaConfig, with_embeddings: bool = True):
        super().__init__()
        self.config = config
        h = config.hidden_size
        ht = int(getattr(config, "target_hidden_size", None) or h)
        k = int(config.draft_vocab_size)
        self.embed_tokens = nn.Embedding(config.vocab_size, h) if with_embeddings else None
        self.fc = nn.Linear(3 * ht, h, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, k, bias=False)
        self.register_buffer("d2t", torch.zeros(k, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary_emb = LlamaRotaryEmbedding(config)
        # float32 copies of the rotary buffers: a cast of the head to float16 must not round the angles
        self._rope32 = {n: b.detach().clone().float() for n, b in self.rotary_emb.named_buffers()
                        if b.is_floating_point()}
        #: LongTensor [K] (draft index -> target token) or None for the identity (K = V, d2t all zero)
        self.targets = None

    def _apply(self, fn, recurse: bool = True):
        out = super()._apply(fn, recurse)
        for name, master in self._rope32.items():
            cur = getattr(self.rotary_emb, name)
            if cur.dtype != torch.float32 or cur.device != master.device:
                master = master.to(cur.device)
                self._rope32[name] = master
                setattr(self.rotary_emb, name, master.clone())
        if self.targets is not None and self.targets.device != self.d2t.device:
            self.targets = self.targets.to(self.d2t.device)
        return out

    def set_vocab_map(self) -> None:
        """Derive :attr:`targets` from the ``d2t`` / ``t2d`` buffers after checking them.

        Raises:
            CheckpointMismatchError: a target id outside ``[0, V)``, repeated target ids, or ``t2d`` that
                does not mark exactly the K mapped tokens.
        """
        k, v = self.d2t.shape[0], self.t2d.shape[0]
        tgt = torch.arange(k, device=self.d2t.device) + self.d2t
        if bool(((tgt < 0) | (tgt >= v)).any()):
            i = int(((tgt < 0) | (tgt >= v)).nonzero()[0])
            raise CheckpointMismatchError(f"d2t maps draft index {i} to target token {int(tgt[i])}, outside the "
                                          f"vocabulary [0, {v})")
        if torch.unique(tgt).numel() != k:
            raise CheckpointMismatchError("d2t maps two draft indices to the same target token")
        marked = self.t2d.to(torch.bool)
        if int(marked.sum()) != k or not bool(marked[tgt].all()):
            raise CheckpointMismatchError(f"t2d marks {int(marked.sum())} target tokens, not exactly the {k} that d2t "
                                          "maps to")
        identity = k == v and not bool(self.d2t.any())
        self.targets = None if identity else tgt

    def tie_embeddings(self, embedding: nn.Embedding) -> None:
        """Use the target's input embedding (``[V, H]``) as ``embed_tokens``.

        Raises:
            CheckpointMismatchError: its shape is not ``[V, H]`` of the head.
        """
        want = (self.config.vocab_size, self.config.hidden_size)
        if tuple(embedding.weight.shape) != want:
            raise CheckpointMismatchError(f"embed_tokens.weight: the checkpoint has none and the target's embedding "
                                          f"has shape {tuple(embedding.weight.shape)}, the head needs {want}")
        self.embed_tokens = embedding

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        """Head outputs for (token_{t+1}, x_t) pairs.

        Args:
            input_ids: LongTensor ``[B, n]``, token_{t+1} of each pair.
            features: float ``[B, n, 3 Ht]`` (the target's fused features: ``fc`` applies) or ``[B, n, H]``
                (the head's own outputs at deeper draft steps: ``fc`` is skipped).
            position_ids: LongTensor ``[B, n]`` (default ``past .. past + n - 1``).
            attention_mask: None (causal over ``cache`` + the new positions) or a 4D additive float mask
                ``[B, 1, n, past + n]`` (0 = visible, ``finfo.min`` = hidden).
            cache: the head's ``DynamicCache`` (updated in place) or None.

        Returns:
            float ``[B, n, H]``: the head output before ``norm``; draft logits = :meth:`draft_logits` of it.

        Raises:
            ValueError: ``features`` neither 3 Ht nor H wide; no embedding set.
        """
        if self.embed_tokens is None:
            raise ValueError("Eagle3Head has no embed_tokens: call tie_embeddings(target_embedding) first")
        b, n = input_ids.shape
        width = features.shape[-1]
        if width == self.fc.in_features:
            hidden = self.fc(features.to(self.fc.weight.dtype))
        elif width == self.config.hidden_size:
            hidden = features.to(self.fc.weight.dtype)
        else:
            raise ValueError(f"EAGLE-3 head features must be {self.fc.in_features} (3 fused target layers) or "
                             f"{self.config.hidden_size} (own outputs) wide, got {width}")
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + n, device=hidden.device)[None].expand(b, n)
        w = self.embed_tokens.weight  # the target's (tied) may live on another device
        emb = self.embed_tokens(input_ids.to(w.device)).to(hidden.device, hidden.dtype)
        if attention_mask is None and n > 1:  # explicit causal mask (also right for eager attention)
            attention_mask = _causal_mask(n, past, hidden.dtype, hidden.device)
        pos = self.rotary_emb(hidden, position_ids)
        return self.midlayer(emb, hidden, pos, attention_mask=attention_mask, cache=cache)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits ``lm_head(norm(hidden))``: float ``[..., K]`` over the draft vocabulary (column i =
        target token ``targets[i]``)."""
        return self.lm_head(self.norm(hidden))


def _causal_mask(n: int, past: int, dtype, device) -> torch.Tensor:
    mask = torch.zeros(n, past + n, dtype=dtype, device=device)
    mask[:, past:] = torch.triu(torch.full((n, n), torch.finfo(dtype).min, dtype=dtype, device=device), 1)
    return mask[None, None]


def _config_value(cfg, name):
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return getattr(text, name, None)


def _weights_folder(path_or_dir) -> tuple[Path, Path]:
    """(folder with config.json, weight file) for a folder or a weight file beside its config.json."""
    p = Path(os.fspath(path_or_dir)).expanduser()
    if p.is_dir():
        weights = next((p / f for f in EAGLE3_WEIGHT_FILES if (p / f).exists()), None)
        if weights is None:
            raise ValueError(f"{p}: no {' or '.join(EAGLE3_WEIGHT_FILES)} (an EAGLE-3 head folder holds config.json "
                             "and the weights)")
        folder = p
    elif p.is_file():
        folder, weights = p.parent, p
    else:
        raise ValueError(f"EAGLE-3 head {p} does not exist (give a local folder with config.json and weights)")
    if not (folder / "config.json").exists():
        raise ValueError(f"{folder}: no config.json beside the EAGLE-3 head weights")
    return folder, weights


def _read_state(weights: Path) -> dict:
    if weights.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(weights))
    return torch.load(weights, map_location="cpu", weights_only=True)


def load_eagle3_head(path_or_dir, target_config, dtype: torch.dtype = torch.float32, device="cpu",
                     embedding: nn.Embedding | None = None, attn_implementation: str = "sdpa") -> Eagle3Head:
    """Load a public EAGLE-3 head checkpoint and check it against the target.

    Args:
        path_or_dir: a local folder with ``config.json`` and ``model.safetensors`` or ``pytorch_model.bin``,
            or the path of such a weight file (its folder holds ``config.json``).
        target_config: the target's transformers config (``hidden_size``, ``vocab_size``).
        dtype, device: where the weights go (the rotary angles stay float32).
        embedding: the target's input embedding, used when the checkpoint has no ``embed_tokens.weight``.
        attn_implementation: ``"sdpa"`` or ``"eager"`` (both apply the tree mask).

    Returns:
        :class:`Eagle3Head` in eval mode, :attr:`~Eagle3Head.targets` set.

    Raises:
        ValueError: a missing folder / file, or a config without ``draft_vocab_size``.
        CheckpointMismatchError (a ValueError): one line naming the key or config entry that is missing,
            unexpected, of the wrong shape or dtype, non-finite, or disagrees with the target (hidden size,
            vocabulary), or an inconsistent ``d2t`` / ``t2d``.
    """
    folder, weights = _weights_folder(path_or_dir)
    with open(folder / "config.json") as f:
        cfg = json.load(f)
    if not isinstance(cfg, dict) or "draft_vocab_size" not in cfg:
        raise ValueError(f"{folder / 'config.json'}: no draft_vocab_size (not an EAGLE-3 head config)")
    config = LlamaConfig(**cfg)
    config.num_hidden_layers = 1
    config._attn_implementation = attn_implementation if attn_implementation in ("sdpa", "eager") else "sdpa"
    h = config.hidden_size
    ht = int(cfg.get("target_hidden_size") or h)
    t_h, t_v = _config_value(target_config, "hidden_size"), _config_value(target_config, "vocab_size")
    if t_h is not None and ht != t_h:
        raise CheckpointMismatchError(f"{folder}: the head fuses target hidden states of width {ht} "
                                      f"(target_hidden_size / hidden_size), the target's hidden_size is {t_h}")
    if t_v is not None and config.vocab_size != t_v:
        raise CheckpointMismatchError(f"{folder}: head vocab_size {config.vocab_size} != target vocab_size {t_v}")
    if 3 * ht == h:
        raise CheckpointMismatchError(f"{folder}: head hidden_size {h} = 3 x target width {ht} is not supported "
                                      "(fused and own features would have the same width)")
    state = _read_state(weights)
    has_emb = "embed_tokens.weight" in state
    head = Eagle3Head(config, with_embeddings=has_emb)
    expected = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    optional = set()
    if config.draft_vocab_size == config.vocab_size:  # identity map: d2t / t2d may be left out
        optional = {"d2t", "t2d"}
    for k in state:
        if k not in expected:
            raise CheckpointMismatchError(f"{folder}: unexpected key {k!r} in the EAGLE-3 head checkpoint")
    for k, shape in expected.items():
        if k not in state:
            if k in optional:
                continue
            raise CheckpointMismatchError(f"{folder}: missing key {k!r} in the EAGLE-3 head checkpoint")
        t = state[k]
        if tuple(t.shape) != shape:
            raise CheckpointMismatchError(f"{folder}: key {k!r} has shape {tuple(t.shape)}, config.json implies "
                                          f"{shape}")
        if k == "d2t":
            if t.is_floating_point() or t.dtype == torch.bool:
                raise CheckpointMismatchError(f"{folder}: key 'd2t' has dtype {t.dtype}, an integer offset is expected")
        elif k == "t2d":
            if t.is_floating_point() or (t.dtype != torch.bool and bool(((t != 0) & (t != 1)).any())):
                raise CheckpointMismatchError(f"{folder}: key 't2d' must be boolean (0/1), got dtype {t.dtype}")
        elif not t.is_floating_point():
            raise CheckpointMismatchError(f"{folder}: key {k!r} has dtype {t.dtype}, a float weight is expected")
        elif not bool(torch.isfinite(t).all()):
            raise CheckpointMismatchError(f"{folder}: key {k!r} holds NaN or inf values")
    if ("d2t" in state) != ("t2d" in state):
        missing = "t2d" if "d2t" in state else "d2t"
        raise CheckpointMismatchError(f"{folder}: missing key {missing!r} in the EAGLE-3 head checkpoint (d2t and t2d "
                                      "come together)")
    load = {k: (v.to(torch.long) if k == "d2t" else v.to(torch.bool) if k == "t2d" else v.to(torch.float32))
            for k, v in state.items()}
    if "d2t" not in load:  # identity map
        load["t2d"] = torch.ones(config.vocab_size, dtype=torch.bool)
        load["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.long)
    head.load_state_dict(load, strict=True)
    try:
        head.set_vocab_map()
    except CheckpointMismatchError as e:
        raise CheckpointMismatchError(f"{folder}: {e}") from None
    head.to(device=device, dtype=dtype)
    if not has_emb:
        if embedding is None:
            raise CheckpointMismatchError(f"{folder}: the checkpoint has no embed_tokens.weight and no target "
                                          "embedding was given")
        try:
            head.tie_embeddings(embedding)
        except CheckpointMismatchError as e:
            raise CheckpointMismatchError(f"{folder}: {e}") from None
    return head.eval()
