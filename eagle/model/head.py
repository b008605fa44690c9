"""The EAGLE-1 draft head and its public checkpoint layout.

Architecture (EAGLE-1, Li et al. 2024): ``fc: Linear(2H -> H)`` on
``concat(embed(token_{t+1}), feature_t)`` (embedding first), then ONE Llama decoder layer
whose input layernorm is absent. No final norm and no own lm_head: draft logits are the
target's ``lm_head(head output)``. ``feature_t`` is the target's last hidden state after its
final norm.

EAGLE-1's own code builds ``config.num_hidden_layers`` decoder layers (its public heads use 1);
layers after the first keep their input layernorm. A second layer lets the head copy from far back
(induction: layer 0 moves the previous token into each position, layer 1 matches on it), which one
layer cannot do because the target's feature barely encodes the current token.

Checkpoint layout (``config.json`` = a LlamaConfig, ``num_hidden_layers`` = L >= 1, plus
``model.safetensors`` or ``pytorch_model.bin``): ``embed_tokens.weight`` (optional),
``fc.weight``, ``fc.bias`` (absent when ``config.bias`` is false), and for each layer i < L
``layers.i.self_attn.{q,k,v,o}_proj.weight``, ``layers.i.mlp.{gate,up,down}_proj.weight``,
``layers.i.post_attention_layernorm.weight``, plus ``layers.i.input_layernorm.weight`` for i >= 1.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from .device import module_device
from .kv_cache import cache_kwargs

__all__ = ["EagleHead", "CheckpointMismatchError", "head_config_from_base", "add_layer"]

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
#: optional draft vocabulary beside the weights (``d2t``: int64 [K], see eagle.train.draft_vocab)
DRAFT_VOCAB_FILE = "draft_vocab.safetensors"


class CheckpointMismatchError(ValueError):
    """A head checkpoint whose keys or shapes do not match the architecture in its config."""


def head_config_from_base(base_config, bias: bool = True, layers: int = 1) -> LlamaConfig:
    """A head LlamaConfig with ``layers`` decoder layers (EAGLE-1: 1) matching a target's config
    (hidden size, heads, rope, vocab).

    Raises:
        ValueError: ``layers`` is not an integer >= 1.
    """
    layers = _layer_count(layers)
    d = base_config.to_dict()
    keep = ["hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "rms_norm_eps", "vocab_size", "max_position_embeddings", "rope_parameters", "rope_theta",
            "rope_scaling", "hidden_act", "attention_bias", "mlp_bias", "pad_token_id", "bos_token_id",
            "eos_token_id"]
    cfg = LlamaConfig(**{k: d[k] for k in keep if k in d and d[k] is not None})
    cfg.num_hidden_layers = layers
    cfg.bias = bool(bias)
    cfg.architectures = ["LlamaForCausalLM"]
    return cfg


class EagleHead(nn.Module):
    """EAGLE-1 draft head.

    Args:
        config: LlamaConfig of the head (``num_hidden_layers`` >= 1; EAGLE-1's public heads have 1).
            ``config.bias`` (default True) sets the bias of ``fc``.
        with_embeddings: allocate ``embed_tokens`` (``[V, H]``). Without it, call
            :meth:`tie_embeddings` with the target's input embedding before use.
    """

    def __init__(self, config: LlamaConfig, with_embeddings: bool = True):
        super().__init__()
        n_layers = _layer_count(getattr(config, "num_hidden_layers", 1))
        self.config = config
        h = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, h) if with_embeddings else None
        self.fc = nn.Linear(2 * h, h, bias=bool(getattr(config, "bias", True)))
        layers = [LlamaDecoderLayer(config, layer_idx=i) for i in range(n_layers)]
        layers[0].input_layernorm = nn.Identity()  # EAGLE-1: the first attention sees fc's output directly
        self.layers = nn.ModuleList(layers)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        # float32 master copies of the rotary buffers: a move to float16 must not round the angles
        # (the target keeps them in float32; see _apply)
        self._rope_float32 = {k: b.detach().clone().float() for k, b in self.rotary_emb.named_buffers()
                              if b.is_floating_point()}
        # draft vocabulary (not part of the checkpoint's state dict): None = the full target vocabulary
        self.register_buffer("d2t", None, persistent=False)

    def set_draft_vocab(self, d2t) -> None:
        """Restrict the draft law to the target tokens ``d2t`` (LongTensor ``[K]``, strictly increasing
        ids in ``[0, vocab_size)``; draft index i = target token ``d2t[i]``), or None for all tokens.

        Raises:
            ValueError: not 1-D integer, empty, unsorted / repeated, or outside the vocabulary.
        """
        if d2t is None:
            self.d2t = None
            return
        d2t = torch.as_tensor(d2t)
        if d2t.dim() != 1 or d2t.numel() == 0 or d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
            raise ValueError(f"draft vocabulary d2t must be a non-empty 1-D integer tensor, got shape "
                             f"{tuple(d2t.shape)} and dtype {d2t.dtype}")
        d2t = d2t.to(torch.long)
        if d2t.numel() > 1 and bool((d2t[1:] <= d2t[:-1]).any()):
            raise ValueError("draft vocabulary d2t must be strictly increasing (sorted, no repeats)")
        if int(d2t[0]) < 0 or int(d2t[-1]) >= self.config.vocab_size:
            raise ValueError(f"draft vocabulary d2t has ids outside the vocabulary [0, {self.config.vocab_size})")
        self.d2t = d2t.to(self.fc.weight.device)

    def _apply(self, fn, recurse: bool = True):
        """``.to(dtype)`` / ``.half()`` cast weights only: the rotary buffers stay float32 (as in the
        target), moved to the new device. Without this, float16 ``inv_freq`` bends relative angles by
        ~0.1 rad at distance 512."""
        out = super()._apply(fn, recurse)
        for name, master in self._rope_float32.items():
            cur = getattr(self.rotary_emb, name)
            if cur.dtype != torch.float32 or cur.device != master.device:
                master = master.to(cur.device)
                self._rope_float32[name] = master
                setattr(self.rotary_emb, name, master.clone())
        return out

    # ------------------------------------------------------------------ forward
    def tie_embeddings(self, embedding: nn.Embedding) -> None:
        """Use the target's input embedding (frozen, shared) as ``embed_tokens``."""
        if embedding.weight.shape != (self.config.vocab_size, self.config.hidden_size):
            raise CheckpointMismatchError(
                f"embed_tokens.weight: target embedding has shape {tuple(embedding.weight.shape)}, head expects "
                f"{(self.config.vocab_size, self.config.hidden_size)}")
        self.embed_tokens = embedding

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        """Predict next features.

        Args:
            input_ids: LongTensor ``[B, n]``, token_{t+1} for each position t.
            features: float ``[B, n, H]``, feature_t (target last hidden state after final norm, or
                the head's own output for deeper draft levels).
            position_ids: LongTensor ``[B, n]`` (default ``past .. past+n-1``).
            attention_mask: None for causal attention over ``cache`` + the new positions, or a 4D
                additive float mask ``[B, 1, n, past + n]`` (0 = visible, ``finfo.min`` = hidden).
            cache: a transformers ``DynamicCache`` for the head (updated in place) or None.

        Returns:
            float ``[B, n, H]``: predicted feature_{t+1}; draft logits = target ``lm_head`` of it.
        """
        if self.embed_tokens is None:
            raise RuntimeError("EagleHead has no embed_tokens: call tie_embeddings(target_embedding) first")
        b, n = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + n, device=input_ids.device)[None].expand(b, n)
        # the embedding is the target's (tied): on a sharded target it lives on the first device, the head on the last
        emb = self.embed_tokens(input_ids.to(module_device(self.embed_tokens))).to(features.device, features.dtype)
        x = self.fc(torch.cat([emb, features], dim=-1))
        if attention_mask is None and n > 1 and past > 0:
            attention_mask = _causal_additive(n, past, x.dtype, x.device)
        pos_emb = self.rotary_emb(x, position_ids)
        for layer in self.layers:
            x = layer(x, attention_mask=attention_mask, position_ids=position_ids, use_cache=cache is not None,
                      position_embeddings=pos_emb, **cache_kwargs(layer, cache))
        return x

    # ------------------------------------------------------------------ checkpoint I/O
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, embedding: nn.Embedding | None = None,
                        dtype: torch.dtype = torch.float32, device="cpu", attn_implementation: str = "sdpa",
                        draft_vocab: bool = True, **hub_kwargs) -> "EagleHead":
        """Load a public EAGLE-1 head checkpoint as it is.

        Args:
            path: a local folder or a hub id with ``config.json`` and ``model.safetensors`` or
                ``pytorch_model.bin``.
            embedding: the target's input embedding, used when the checkpoint has no
                ``embed_tokens.weight``.
            dtype, device: where the weights go.
            draft_vocab: load the optional ``draft_vocab.safetensors`` beside the weights (a head
                without it drafts over the full vocabulary).

        Raises:
            FileNotFoundError: no config / weight file.
            CheckpointMismatchError: an unexpected or missing key, or a shape that disagrees with the
                config (the message names the key).
        """
        folder = _resolve_folder(path, **hub_kwargs)
        with open(folder / "config.json") as f:
            cfg_dict = json.load(f)
        try:
            n_layers = _layer_count(cfg_dict.get("num_hidden_layers", 1))
        except ValueError as e:
            raise CheckpointMismatchError(f"{folder / 'config.json'}: {e}") from e
        config = LlamaConfig(**cfg_dict)
        config.num_hidden_layers = n_layers
        config.bias = bool(cfg_dict.get("bias", True))
        config._attn_implementation = attn_implementation
        state = _load_state(folder)
        has_emb = "embed_tokens.weight" in state
        model = cls(config, with_embeddings=has_emb)
        expected = {k: v.shape for k, v in model.state_dict().items()}
        floating = {k: v.is_floating_point() for k, v in model.state_dict().items()}
        for k in state:
            if k not in expected:
                raise CheckpointMismatchError(f"{folder}: unexpected key {k!r} in the head checkpoint "
                                              f"(expected keys: {sorted(expected)})")
        for k, shape in expected.items():
            if k not in state:
                raise CheckpointMismatchError(f"{folder}: missing key {k!r} in the head checkpoint")
            if tuple(state[k].shape) != tuple(shape):
                raise CheckpointMismatchError(f"{folder}: key {k!r} has shape {tuple(state[k].shape)}, "
                                              f"config implies {tuple(shape)}")
            if floating[k] and not state[k].is_floating_point():
                raise CheckpointMismatchError(f"{folder}: key {k!r} has dtype {state[k].dtype}, a float "
                                              "weight is expected")
            if state[k].is_floating_point() and not bool(torch.isfinite(state[k]).all()):
                raise CheckpointMismatchError(f"{folder}: key {k!r} holds NaN or inf values")
        model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=True)
        model.to(device=device, dtype=dtype)
        if not has_emb:
            if embedding is None:
                raise CheckpointMismatchError(f"{folder}: checkpoint has no embed_tokens.weight and no target "
                                              "embedding was given")
            model.tie_embeddings(embedding)
        if draft_vocab and (folder / DRAFT_VOCAB_FILE).exists():
            from safetensors.torch import load_file

            try:
                model.set_draft_vocab(load_file(str(folder / DRAFT_VOCAB_FILE))["d2t"])
            except (KeyError, ValueError) as e:
                raise CheckpointMismatchError(f"{folder / DRAFT_VOCAB_FILE}: {e}") from e
        return model

    def save_pretrained(self, folder: str | os.PathLike, dtype: torch.dtype = torch.float16,
                        include_embeddings: bool = False) -> Path:
        """Write ``config.json`` + ``model.safetensors`` in the public EAGLE-1 layout.

        ``include_embeddings=False`` leaves ``embed_tokens`` out (it is the target's, loaded from the
        base model), which keeps small-vocab-heavy heads a few MB.
        """
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in self.state_dict().items()
                 if include_embeddings or not k.startswith("embed_tokens.")}
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        cfg = self.config.to_dict()
        cfg["bias"] = bool(getattr(self.config, "bias", True))
        cfg["num_hidden_layers"] = len(self.layers)
        for k in ("_attn_implementation", "_attn_implementation_autoset", "dtype", "torch_dtype"):
            cfg.pop(k, None)
        with open(folder / "config.json", "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True, default=str)
        return folder


def add_layer(head: "EagleHead") -> "EagleHead":
    """A copy of ``head`` with one more decoder layer appended, computing the SAME function: the new
    layer's ``o_proj`` and ``down_proj`` are zero, so its residual branches add nothing until trained
    (its other weights are drawn as transformers initialises a Llama layer, its input layernorm is 1).

    Args:
        head: an :class:`EagleHead` with ``L`` layers (its ``embed_tokens`` and draft vocabulary are
            shared with the copy, not duplicated).

    Returns:
        a new :class:`EagleHead` with ``L + 1`` layers, float32 on ``head``'s device.
    """
    import copy

    config = copy.deepcopy(head.config)
    config.num_hidden_layers = len(head.layers) + 1
    out = EagleHead(config, with_embeddings=False)
    new = out.layers[-1]
    std = float(getattr(config, "initializer_range", 0.02))
    with torch.no_grad():
        for name, p in new.named_parameters():
            if name.endswith("layernorm.weight"):
                p.fill_(1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight", ".bias")):
                p.zero_()
            else:
                p.normal_(0.0, std)
    own = {k: v for k, v in head.state_dict().items() if not k.startswith("embed_tokens.")}
    missing, unexpected = out.load_state_dict(own, strict=False)
    assert not unexpected and all(k.startswith(f"layers.{len(head.layers)}.") for k in missing), (missing, unexpected)
    out.to(device=head.fc.weight.device, dtype=torch.float32)
    if head.embed_tokens is not None:
        out.embed_tokens = head.embed_tokens
    out.d2t = head.d2t
    return out


def _layer_count(layers) -> int:
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ValueError(f"a head needs an integer number of decoder layers >= 1 (num_hidden_layers), got {layers!r}")
    return layers


def _causal_additive(n: int, past: int, dtype, device) -> torch.Tensor:
    mask = torch.zeros(n, past + n, dtype=dtype, device=device)
    mask[:, past:] = torch.triu(torch.full((n, n), torch.finfo(dtype).min, dtype=dtype, device=device), 1)
    return mask[None, None]


def _resolve_folder(path, **hub_kwargs) -> Path:
    p = Path(path)
    if p.is_dir():
        if not (p / "config.json").exists():
            raise FileNotFoundError(f"{p}: no config.json (an EAGLE-1 head folder needs config.json + weights)")
        return p
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:  # pragma: no cover
        raise FileNotFoundError(f"{path} is not a folder and huggingface_hub is missing") from e
    try:
        return Path(snapshot_download(str(path), allow_patterns=["config.json", *WEIGHT_FILES], **hub_kwargs))
    except Exception as e:
        raise FileNotFoundError(f"{path}: not a local folder, and the hub download failed ({e})") from e


def _load_state(folder: Path) -> dict:
    if (folder / "model.safetensors").exists():
        from safetensors.torch import load_file

        return load_file(str(folder / "model.safetensors"))
    if (folder / "pytorch_model.bin").exists():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{folder}: no model.safetensors or pytorch_model.bin")
