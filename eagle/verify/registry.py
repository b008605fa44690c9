"""The verifier registry: names -> (drafting rule, verify, outcome_probs).

The generation loop talks only to this registry. ``eagle`` registers ``rrsw`` (EAGLE-1);
``univer_patch`` registers ``traversal``, ``greedy`` and ``univer`` when it is imported
(an explicit registration, no monkeypatching). :func:`get_verifier` imports ``univer_patch``
on the first lookup of a name it does not know.

Common tree form of one verification step (every verifier takes exactly this):
    parents:      LongTensor [N]; node 0 is the root (parent -1); parents[i] < i; siblings in
                  rank order have increasing index.
    tokens:       LongTensor [N]; tokens[0] is the root token.
    target_probs: float Tensor [N, V]; row i = M_b(. | node i), processed (temperature/top-p/top-k).
    draft_probs:  float Tensor [N, V]; row i = the full processed draft law M_s(. | node i) that
                  node i's children were drawn from (before any removal). Rows of leaves are unused.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

__all__ = ["Verifier", "DRAFTING_RULES", "register_verifier", "get_verifier", "available_verifiers"]

#: Drafting rules (REFERENCE section 1): "wor" = without replacement from M_s;
#: "topk_residual" = top-(m-1) of M_s plus one draw from the residual; "topk" = top-m (temperature 0).
DRAFTING_RULES = ("wor", "topk_residual", "topk")

VerifyFn = Callable[..., tuple]
OutcomeFn = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Verifier:
    """A registered verification method.

    Attributes:
        name: registry key (e.g. ``"rrsw"``).
        drafting: the drafting rule its losslessness proof assumes, one of :data:`DRAFTING_RULES`.
        verify: ``(parents, tokens, target_probs, draft_probs, generator=None) -> (node_index, next_token)``
            one sampled outcome: the deepest accepted node and the token that follows it (ints).
        outcome_probs: ``(parents, tokens, target_probs, draft_probs) -> Tensor[N, V]``: the exact
            probability of every outcome (node i is the end of the accepted path, next token y).
        description: one line for ``--help`` texts and the README.
    """

    name: str
    drafting: str
    verify: VerifyFn
    outcome_probs: OutcomeFn
    description: str = ""


_REGISTRY: dict[str, Verifier] = {}


def register_verifier(v: Verifier, overwrite: bool = False) -> Verifier:
    """Add ``v`` to the registry. Raises ``ValueError`` on a bad drafting rule or a taken name."""
    if v.drafting not in DRAFTING_RULES:
        raise ValueError(f"verifier {v.name!r}: unknown drafting rule {v.drafting!r}; use one of {DRAFTING_RULES}")
    if v.name in _REGISTRY and not overwrite and _REGISTRY[v.name] is not v:
        raise ValueError(f"verifier {v.name!r} is already registered")
    _REGISTRY[v.name] = v
    return v


def available_verifiers() -> list[str]:
    """Names of all registered verifiers (after loading ``univer_patch`` if it is importable)."""
    _load_plugins()
    return sorted(_REGISTRY)


def _load_plugins() -> None:
    import importlib

    import eagle.verify.rrsw  # noqa: F401  (registers "rrsw")
    try:
        importlib.import_module("univer_patch")
    except ImportError:  # pragma: no cover - univer_patch ships with this package
        pass


def get_verifier(name_or_verifier) -> Verifier:
    """Look a verifier up by name (a :class:`Verifier` passes through).

    Raises:
        ValueError: for an unknown name (the message lists the known ones).
    """
    if isinstance(name_or_verifier, Verifier):
        return name_or_verifier
    name = str(name_or_verifier).lower()
    if name not in _REGISTRY:
        _load_plugins()
    if name not in _REGISTRY:
        raise ValueError(f"unknown verifier {name_or_verifier!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[name]
