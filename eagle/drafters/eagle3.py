"""EAGLE-3 drafting over a static tree (drafter ``eagle3``) with a public EAGLE-3 head.

The head (:class:`~eagle.model.eagle3_head.Eagle3Head`, loaded from ``drafter_options={"path": folder}``)
reads the target's fused features: the drafter declares :attr:`feature_layers` (EAGLE-3's hidden states 2,
``L // 2`` and ``L - 3`` of a target with L decoder layers), so the engine passes their concatenation
``[1, k, 3 H]`` to :meth:`start` / :meth:`accept`. Committed pairs (token_{t+1}, fused feature_t) enter the
head's KV cache through ``fc``; a tree node at depth >= 2 is fed its parent's head output (H wide), as in
EAGLE-3's ``topK_genrate``. The tree is the caller's static tree, expanded level by level exactly as the
EAGLE-1 drafter does (:class:`~eagle.drafting.EagleTreeDrafter`: tree attention mask, one host sync).

Draft laws: the processed softmax of ``lm_head(norm(h))`` over the K draft tokens, placed on their target
ids (``i + d2t[i]``) and zero on every other token. Children are drawn from exactly that law under the
verifier's drafting rule (``wor``, ``topk_residual`` or ``topk``), and the verifiers use it, so every
registered verifier is lossless with it (tokens outside the draft vocabulary come from the residual / bonus
draws of the target).
"""
from __future__ import annotations

import os

import torch

from ..drafting import EagleTreeDrafter
from ..model.kv_cache import new_cache
from ..rules import DRAFTING_RULES

__all__ = ["Eagle3Drafter"]


class Eagle3Drafter(EagleTreeDrafter):
    """EAGLE-3 head drafting on the caller's static tree (see the module docstring).

    Args:
        head: an :class:`~eagle.model.eagle3_head.Eagle3Head` (embeddings set).
        lm_head: the target's output projection (only its vocabulary size V is read: the width of the
            draft-law rows).
        feature_layers: the target hidden states fused by ``head.fc`` (indices into transformers'
            ``hidden_states``), as many as ``fc`` expects.

    Raises:
        ValueError: ``feature_layers`` whose count does not match ``head.fc``.
    """

    name = "eagle3"
    needs_head = False  # its own head, from drafter_options={"path": ...}; not the model's EAGLE-1 head
    needs_features = True
    drafting_rules = DRAFTING_RULES

    def __init__(self, head, lm_head, feature_layers):
        super().__init__(head, lm_head)
        layers = tuple(feature_layers)
        width = head.fc.in_features
        ht = int(getattr(head.config, "target_hidden_size", None) or head.config.hidden_size)
        if len(layers) * ht != width:
            raise ValueError(f"drafter 'eagle3': {len(layers)} feature layers of width {ht} do not fit the head's fc "
                             f"input of width {width}")
        self.feature_layers = layers

    @staticmethod
    def check_options(options: dict) -> None:
        """Check :meth:`for_model`'s options without loading anything (the harness calls it at the door).

        Raises:
            ValueError: an unknown option, no ``path``, or a ``path`` that is not a local head folder / weight
                file beside its ``config.json`` (one line).
        """
        from ..model.eagle3_head import _weights_folder, check_feature_layers  # lazy: transformers' Llama

        unknown = sorted(set(options) - {"path", "feature_layers"})
        if unknown:
            raise ValueError(f"drafter 'eagle3': unknown option(s) {unknown}; it takes path (the EAGLE-3 head folder) "
                             f"and feature_layers")
        path = options.get("path")
        if path is None or (isinstance(path, str) and not path.strip()):
            raise ValueError("drafter 'eagle3' needs the EAGLE-3 head: path=<head folder>")
        if not isinstance(path, (str, os.PathLike)):
            raise ValueError(f"drafter 'eagle3': path must be a folder, got {type(path).__name__}")
        _weights_folder(path)
        if options.get("feature_layers") is not None:
            try:
                check_feature_layers(options["feature_layers"], None)
            except ValueError as e:
                raise ValueError(f"drafter 'eagle3': {e}") from None

    @classmethod
    def for_model(cls, model, path=None, feature_layers=None, **unknown) -> "Eagle3Drafter":
        """Load the EAGLE-3 head at ``path`` for ``model`` (an :class:`~eagle.model.ea_model.EaModel`).

        Args:
            path: folder (or weight file) of the EAGLE-3 head (:func:`~eagle.model.eagle3_head.load_eagle3_head`).
            feature_layers: override of the fused hidden states (default EAGLE-3's ``(2, L // 2, L - 3)``),
                checked against the target's layer count.

        Raises:
            ValueError: no ``path``; a target with fewer than 3 layers; bad ``feature_layers``; any checkpoint
                mismatch (one line naming the key, see ``load_eagle3_head``).
        """
        if path is None and not unknown:
            raise ValueError("drafter 'eagle3' needs the EAGLE-3 head: drafter_options={'path': <head folder>}")
        opts = {"path": path, **unknown} | ({} if feature_layers is None else {"feature_layers": feature_layers})
        cls.check_options(opts)
        from ..model.eagle3_head import check_feature_layers, eagle3_feature_layers, load_eagle3_head

        base = model.base_model
        cfg = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
        n_layers = getattr(cfg, "num_hidden_layers", None)
        if feature_layers is None:
            layers = eagle3_feature_layers(n_layers)
        else:
            layers = check_feature_layers(feature_layers, n_layers)
        w = model.lm_head.weight
        dtype = w.dtype if w.dtype.is_floating_point else torch.float32
        attn = getattr(base.config, "_attn_implementation", None)
        head = load_eagle3_head(path, base.config, dtype=dtype, device=model.device,
                                embedding=base.get_input_embeddings(),
                                attn_implementation=attn if attn in ("sdpa", "eager") else "sdpa")
        if w.shape[0] != head.config.vocab_size:
            raise ValueError(f"drafter 'eagle3': head vocab_size {head.config.vocab_size} != the target's lm_head "
                             f"rows {w.shape[0]}")
        return cls(head, model.lm_head, layers)

    def start(self, input_ids: torch.Tensor, features: torch.Tensor | None = None) -> None:
        """A fresh head cache; the prompt's pairs (input_ids[t+1], fused features[t]) are consumed at the first
        draft.

        Raises:
            ValueError: no features, or features not as wide as the head's ``fc`` input (the engine did not
                pass the declared :attr:`feature_layers`).
        """
        self._check_features(features)
        self.head_cache = new_cache(self.head.config)
        self._pending = (input_ids[:, 1:], features, False)
        self._root_hidden = None

    def accept(self, tokens: torch.Tensor, features: torch.Tensor | None = None) -> None:
        self._check_features(features)
        self._pending = (tokens, features, True)

    def _check_features(self, features) -> None:
        want = self.head.fc.in_features
        if features is None or features.shape[-1] != want:
            got = None if features is None else tuple(features.shape)
            raise ValueError(f"drafter 'eagle3' needs the target's fused hidden states {self.feature_layers} "
                             f"([1, k, {want}]), got {got}")

    def _draft_logits(self, hidden: torch.Tensor):
        """Draft logits ``[n, K]`` (float32) over the draft vocabulary and its target ids (LongTensor ``[K]``,
        None for the identity map)."""
        return self.head.draft_logits(hidden).float(), self.head.targets

    def refresh(self, model) -> None:
        self.lm_head = model.lm_head
