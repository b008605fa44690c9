"""A separate draft language model (drafter ``draft_lm``): the paper's Table 7 setting (Llama-2-7B drafted
by Llama-68M).

Any causal LM that shares the target's tokenizer (same vocabulary, same ids) drafts the caller's static
tree from its own next-token laws, with its own KV cache (a transformers ``DynamicCache``, committed tokens
only between cycles):

  - :meth:`DraftLMDrafter.start` prefills the draft model on the prompt;
  - :meth:`DraftLMDrafter.accept` keeps the committed tokens; they are fed lazily, at the next draft
    (with the root), as :class:`~eagle.drafting.EagleTreeDrafter` does with its head;
  - :meth:`DraftLMDrafter.draft` expands the tree level by level (SpecInfer / EAGLE-style tree drafting):
    the expanded nodes of one depth in ONE forward of the draft model, at positions
    ``C - 1 + depth`` (C = committed tokens, the root included), under a 4D additive tree mask
    (:func:`eagle.tree.additive_mask`: every committed position, the node's tree ancestors and itself);
    the tree positions are cropped from the cache afterwards.

Draft laws: the draft model's logits processed by the SAME sampling config as the target's
(:func:`eagle.sampling.logits_to_probs`; at temperature 0 the softmax of the raw logits, whose ranking the
``topk`` rule uses), children drawn by :func:`eagle.rules.draw_children` under the verifier's drafting rule
with the caller's generator. The :class:`~eagle.drafting.DraftTree` carries exactly those laws, so every
drafting rule, hence every registered verifier, is lossless with it (REFERENCE section 1).
"""
from __future__ import annotations

import inspect
from pathlib import Path

import torch

from ..drafting import Drafter, DraftTree, pruned_draft_tree
from ..model.cpu_attention import CPU_TREE_SDPA
from ..model.device import module_device
from ..model.kv_cache import cache_kwargs, cache_length, new_cache, truncate_cache
from ..rules import DRAFTING_RULES, draw_children
from ..sampling import SamplingConfig, logits_to_probs
from ..tree import TreeBuffers, additive_mask

__all__ = ["DraftLMDrafter"]

#: attention implementations that apply a 4D additive mask (None = transformers' default, sdpa / eager)
_TREE_MASK_ATTENTION = (None, "eager", "sdpa", CPU_TREE_SDPA)
_DTYPES = {"float16": torch.float16, "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float32": torch.float32, "fp32": torch.float32}


def _as_dtype(dtype) -> torch.dtype | None:
    """None, a floating ``torch.dtype`` or one of :data:`_DTYPES`' names -> ``torch.dtype`` (or None).

    Raises:
        ValueError: anything else (one line).
    """
    if dtype is None or (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        return dtype
    if isinstance(dtype, str) and dtype.strip().lower() in _DTYPES:
        return _DTYPES[dtype.strip().lower()]
    raise ValueError(f"drafter 'draft_lm': dtype must be None, a floating torch.dtype or one of {sorted(_DTYPES)}, "
                     f"got {dtype!r}")


class DraftLMDrafter(Drafter):
    """Tree drafting with a separate causal LM sharing the target's tokenizer (drafter ``draft_lm``).

    Args:
        model: the draft model, a transformers causal LM (``PreTrainedModel`` with ``get_output_embeddings``);
            put in eval mode. Its output rows (vocabulary) must number ``vocab``.
        vocab: V, the target's vocabulary (its ``lm_head`` rows); None = the draft model's own.

    Raises:
        ValueError: a draft vocabulary other than ``vocab`` (both numbers), an attention implementation that
            cannot apply a tree mask, or a model without an output embedding (one line each).
    """

    name = "draft_lm"
    needs_head = False
    needs_features = False
    uses_tree = True
    drafting_rules = DRAFTING_RULES

    def __init__(self, model, vocab: int | None = None):
        out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if out is None or getattr(out, "weight", None) is None:
            raise ValueError(f"drafter 'draft_lm': the draft model ({type(model).__name__}) has no output embedding "
                             f"(lm_head); pass a causal LM")
        rows = int(out.weight.shape[0])
        if vocab is not None and rows != int(vocab):
            raise ValueError(f"drafter 'draft_lm': the draft model's vocabulary ({rows} lm_head rows) differs from the "
                             f"target's ({int(vocab)} lm_head rows); the two must share the tokenizer")
        impl = getattr(model.config, "_attn_implementation", None)
        if impl not in _TREE_MASK_ATTENTION:
            raise ValueError(f"drafter 'draft_lm': draft model attention implementation {impl!r} cannot apply the tree "
                             f"attention mask; load it with attn_implementation='sdpa' (or 'eager')")
        self.model = model.eval()
        self.vocab = rows
        self.cache = None
        self._pending = None  # LongTensor [1, k] of committed tokens not yet fed (None: none)
        self._has_root = False  # whether _pending ends with the next root
        self._root_logits = None  # float32 [1, V]: the draft logits after the last committed token
        params = inspect.signature(type(model).forward).parameters
        self._keep_arg = "logits_to_keep" in params

    # ------------------------------------------------------------------ construction
    @staticmethod
    def check_options(options: dict) -> None:
        """Check ``for_model``'s options without loading anything (the harness calls it at the door).

        Raises:
            ValueError: an unknown option, a missing or empty ``model_path_or_module``, a local folder that does
                not exist, or a bad ``dtype``.
        """
        unknown = sorted(set(options) - {"model_path_or_module", "dtype"})
        if unknown:
            raise ValueError(f"drafter 'draft_lm': unknown option(s) {unknown}; it takes model_path_or_module "
                             f"(a causal LM, a hub id or a folder) and dtype")
        src = options.get("model_path_or_module")
        if src is None or (isinstance(src, (str, Path)) and not str(src).strip()):
            raise ValueError("drafter 'draft_lm' needs model_path_or_module: the draft causal LM (a loaded "
                             "PreTrainedModel, a hub id or a folder, e.g. JackFram/llama-68m)")
        if not isinstance(src, (str, Path, torch.nn.Module)):
            raise ValueError(f"drafter 'draft_lm': model_path_or_module must be a model, a hub id or a folder, "
                             f"got {type(src).__name__}")
        _as_dtype(options.get("dtype"))
        if isinstance(src, (str, Path)):
            p = Path(str(src)).expanduser()
            looks_local = p.is_absolute() or str(src).startswith((".", "~")) or str(src).count("/") > 1
            if looks_local and not p.exists():
                raise ValueError(f"drafter 'draft_lm': draft model folder {src} does not exist (a hub id looks like "
                                 f"org/name)")

    @classmethod
    def for_model(cls, model, model_path_or_module=None, dtype=None, **unknown) -> "DraftLMDrafter":
        """A draft-LM drafter for the target ``model`` (an :class:`~eagle.model.ea_model.EaModel`).

        Args:
            model: the target; its ``lm_head`` rows give V and its ``device`` the logits' device.
            model_path_or_module: a loaded causal LM (used as it is; cast in place to ``dtype`` if given), or a hub id /
                folder loaded with ``AutoModelForCausalLM.from_pretrained`` in ``dtype`` (default: the target
                lm_head's dtype) and moved to the target's logits device.
            dtype: None, a floating ``torch.dtype`` or a name ("float16", "bfloat16", "float32").

        Raises:
            ValueError: see :meth:`check_options` (``unknown``: any other option); a vocabulary size other than
                the target's (both numbers); a draft model whose logits are on another device than the target's;
                a draft model that cannot be loaded (transformers' OSError / ValueError, first line), or a checkpoint
                missing weights of the causal LM (e.g. a base model without its LM head).
        """
        cls.check_options({"model_path_or_module": model_path_or_module, "dtype": dtype, **unknown})
        dtype = _as_dtype(dtype)
        device = torch.device(model.device)
        if isinstance(model_path_or_module, torch.nn.Module):
            draft = model_path_or_module if dtype is None else model_path_or_module.to(dtype)
        else:
            from transformers import AutoModelForCausalLM

            w = model.lm_head.weight
            dt = dtype or (w.dtype if w.dtype.is_floating_point else torch.float32)
            try:
                draft, info = AutoModelForCausalLM.from_pretrained(str(model_path_or_module), dtype=dt,
                                                                   output_loading_info=True)
                draft = draft.to(device)
            except (OSError, ValueError) as e:  # not found locally nor on the hub, no network, not a model: one line
                msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ValueError(f"drafter 'draft_lm': cannot load the draft model {model_path_or_module}: "
                                 f"{msg}") from None
            missing = sorted(info.get("missing_keys") or [])
            if missing:  # e.g. a base model without its LM head: transformers would fill them with random weights
                raise ValueError(f"drafter 'draft_lm': the draft model {model_path_or_module} has no weights for "
                                 f"{len(missing)} parameter(s) of {type(draft).__name__} (e.g. {missing[0]}); "
                                 f"it is not a causal LM checkpoint (it would draft with random weights)")
        vocab = int(model.lm_head.weight.shape[0])
        out = draft.get_output_embeddings() if hasattr(draft, "get_output_embeddings") else None
        if out is not None and getattr(out, "weight", None) is not None:
            dev = module_device(out)
            if dev != device:
                raise ValueError(f"drafter 'draft_lm': the draft model computes its logits on {dev}, the target's "
                                 f"logits are on {device}; put the draft model on {device}")
        return cls(draft, vocab)

    # ------------------------------------------------------------------ the drafter calls
    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None = None,
                 last_only: bool = False) -> torch.Tensor:
        """Draft-model forward on top of :attr:`cache` (extended in place).

        Args:
            tokens, positions: LongTensor ``[1, k]``; mask: None (causal) or float ``[1, 1, k, past + k]``.
            last_only: only the last position's logits are needed.

        Returns:
            float32 logits ``[k', V]`` (k' = 1 with ``last_only``, else k) on the draft model's logits device.
        """
        inp = module_device(self.model.get_input_embeddings())
        kw = cache_kwargs(self.model, self.cache)
        if last_only and self._keep_arg:
            kw["logits_to_keep"] = 1
        out = self.model(input_ids=tokens.to(inp), position_ids=positions.to(inp),
                         attention_mask=None if mask is None else mask.to(inp), use_cache=True, **kw)
        logits = out.logits[0]
        return (logits[-1:] if last_only else logits).float()

    @torch.no_grad()
    def start(self, input_ids: torch.Tensor, features=None) -> None:
        """A fresh draft cache, prefilled on the prompt ``input_ids`` (LongTensor ``[1, L]``, L >= 1)."""
        if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
            raise ValueError(f"drafter 'draft_lm': start takes a prompt of shape [1, L >= 1], got "
                             f"{tuple(input_ids.shape)}")
        self.cache = new_cache(self.model.config)
        L = input_ids.shape[1]
        self._forward(input_ids, torch.arange(L, device=input_ids.device)[None], last_only=True)
        self._pending, self._has_root, self._root_logits = None, False, None

    def accept(self, tokens: torch.Tensor, features=None) -> None:
        """Keep the committed ``tokens`` (LongTensor ``[1, k]``: accepted draft tokens, then the next root); they
        are fed to the draft model at the next :meth:`draft`."""
        if self.cache is None:
            raise ValueError("drafter 'draft_lm': accept before start")
        self._pending = tokens if self._pending is None else torch.cat([self._pending, tokens.to(self._pending)], 1)
        self._has_root = True

    @torch.no_grad()
    def consume(self, root: int) -> torch.Tensor:
        """Feed the pending committed tokens (the root last) to the draft model.

        Returns:
            float32 ``[1, V]``: the draft logits after the root (the law of the root's children).

        Raises:
            ValueError: called before :meth:`start`.
        """
        if self.cache is None:
            raise ValueError("drafter 'draft_lm': draft before start")
        if self._pending is not None or (not self._has_root and self._root_logits is None):
            dev = module_device(self.model.get_input_embeddings())
            tokens = self._pending if self._pending is not None else torch.empty(1, 0, dtype=torch.long, device=dev)
            if not self._has_root:
                tokens = torch.cat([tokens.to(dev), torch.full((1, 1), int(root), dtype=torch.long, device=dev)], 1)
            past = cache_length(self.cache)
            pos = torch.arange(past, past + tokens.shape[1], device=dev)[None]
            self._root_logits = self._forward(tokens, pos, last_only=True)
            self._pending, self._has_root = None, True
        return self._root_logits

    @torch.no_grad()
    def draft(self, root: int, tree: TreeBuffers, rule: str, cfg: SamplingConfig,
              generator: torch.Generator | None = None) -> DraftTree:
        """Draft ``tree`` below ``root`` (the last committed token) from the draft model's laws.

        Node v at depth d >= 1 is fed its token at position ``C - 1 + d`` (C committed tokens, the root
        included) and attends to the committed positions, its tree ancestors and itself; the expanded nodes
        of one depth go in one forward (:class:`~eagle.tree.buffers.LevelPlan`); the cache is cropped back to
        C afterwards. One host read (the drafted tokens and the logits' finiteness flag together).

        Args:
            root: the last committed token.
            tree: the caller's static tree.
            rule: "wor", "topk_residual" or "topk" (REFERENCE section 1).
            cfg: the sampling processing of the draft logits (the target's).
            generator: the caller's generator on the draft laws' device (None = global RNG).

        Returns:
            :class:`~eagle.drafting.DraftTree`: ``draft_probs`` float32 ``[n, V]`` (row i = the processed draft
            law node i's children were drawn from); nodes that could not be drafted (the law's support had
            fewer tokens than the node's rank) are pruned with their subtrees.

        Raises:
            ValueError: an unknown rule, no tree, a draft before :meth:`start`, NaN or inf draft logits.
        """
        if rule not in DRAFTING_RULES:
            raise ValueError(f"unknown drafting rule {rule!r}; use one of {DRAFTING_RULES}")
        if tree is None:
            raise ValueError("drafter 'draft_lm' drafts the caller's static tree, got tree=None")
        root_logits = self.consume(root)
        device = root_logits.device
        plan = tree.on(device)
        n = tree.num_nodes
        committed = cache_length(self.cache)
        tokens = torch.full((n,), -1, dtype=torch.long, device=device)
        tokens[0] = int(root)
        draft_probs = torch.zeros(n, self.vocab, dtype=torch.float32, device=device)
        extremes = []  # (min, max) of every level's logits, checked with the one host read
        mdt = getattr(self.model, "dtype", torch.float32)
        mask_dtype = mdt if mdt.is_floating_point else torch.float32
        try:
            for d, level in enumerate(plan.levels):
                expand = level.expand
                if d == 0:
                    logits = root_logits
                else:  # undrafted nodes (token -1) are expanded with token 0 and pruned afterwards
                    logits = self._forward(tokens[expand].clamp(min=0)[None],
                                           (committed - 1 + plan.depth[expand])[None],
                                           additive_mask(level.visible, committed, mask_dtype)).to(device)
                extremes.append(torch.stack(torch.aminmax(logits)))
                logits = torch.nan_to_num(logits, nan=0.0, posinf=0.0, neginf=0.0)  # reported after the read
                q = torch.softmax(logits, -1) if cfg.greedy else logits_to_probs(logits, cfg, check=False)
                draft_probs[expand] = q
                for m, rows, child_idx in level.groups:
                    kids = draw_children(q[rows], min(m, q.shape[1]), rule, generator)  # [g, min(m, V)]
                    if kids.shape[1] < m:  # more children than tokens: the extra ones are pruned
                        kids = torch.cat([kids, kids.new_full((kids.shape[0], m - kids.shape[1]), -1)], 1)
                    tokens[child_idx.flatten()] = kids.flatten()
        finally:
            truncate_cache(self.cache, committed)
        finite = torch.isfinite(torch.stack(extremes)).all() if extremes else torch.ones((), dtype=torch.bool,
                                                                                         device=device)
        host = torch.cat([tokens, finite.to(torch.long)[None]]).tolist()  # the one host read
        if not host[-1]:
            raise ValueError("draft logits (draft model of drafter 'draft_lm') contain NaN or inf")
        return _pruned(plan, tokens, draft_probs, host[:-1])


def _pruned(plan, tokens: torch.Tensor, draft_probs: torch.Tensor, tok: list) -> DraftTree:
    """:func:`eagle.drafting.pruned_draft_tree` (kept under this name for this module's callers)."""
    return pruned_draft_tree(plan, tokens, draft_probs, tok)
