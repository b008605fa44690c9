"""UniVer, Traversal and Greedy verifiers: a plugin of :mod:`eagle.verify.registry`.

Importing this package registers ``greedy`` (drafting ``topk_residual``), ``traversal``
(``wor``) and ``univer`` (``topk_residual``) (explicit registration, no monkeypatching). ``eagle``
never imports it: import it yourself (``import univer_patch``, also from a source tree with
``PYTHONPATH=.``), pass ``--plugin univer_patch`` to the harness, or install the distribution,
whose entry point in the group ``univer_eagle.verifiers`` lets
:func:`eagle.verify.available_verifiers` load it. The helpers below dispatch through the registry.
"""
from __future__ import annotations

import torch

from eagle.verify import get_verifier

from . import greedy, traversal, univer  # noqa: F401  (register the verifiers)

__all__ = ["verify", "outcome_probs", "apply", "get_verifier"]


def verify(method: str, parents: torch.Tensor, tokens: torch.Tensor, target_probs: torch.Tensor,
           draft_probs: torch.Tensor, generator: torch.Generator | None = None) -> tuple[int, int]:
    """One verification step with a registered method.

    Args:
        method: registry name (``"rrsw"``, ``"traversal"``, ``"greedy"``, ``"univer"``).
        parents, tokens: LongTensor ``[N]``; target_probs, draft_probs: float ``[N, V]`` (the common
            tree form of :mod:`eagle.verify.registry`), drafted with the method's rule.
        generator: optional ``torch.Generator`` for the uniforms.

    Returns:
        ``(node_index, next_token)``: the last accepted node and the token after it.

    Raises:
        ValueError: unknown method or invalid inputs (the message names the node).
    """
    return get_verifier(method).verify(parents, tokens, target_probs, draft_probs, generator)


def outcome_probs(method: str, parents: torch.Tensor, tokens: torch.Tensor, target_probs: torch.Tensor,
                  draft_probs: torch.Tensor) -> torch.Tensor:
    """Exact outcome law ``[N, V]`` of a method: P(node i ends the accepted path, next token y).

    The total is 1. Raises ``ValueError`` as :func:`verify`.
    """
    return get_verifier(method).outcome_probs(parents, tokens, target_probs, draft_probs)


def apply(ea_model, method: str):
    """Select ``method`` as ``ea_model``'s verifier (``ea_model.set_verifier(method)``); returns ea_model."""
    ea_model.set_verifier(method)
    return ea_model
