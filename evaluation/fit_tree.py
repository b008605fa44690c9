"""Fit the static tree to this machine once (``tree_choices="auto"``), or show the cached fit and why.

    python -m evaluation.fit_tree --temperature 0 [--refresh]

See :mod:`eagle.autotree` (measurement, cache) and :mod:`eagle.tree.auto` (the exact fit).
"""
from __future__ import annotations

import torch

from eagle.autotree import resolve_auto_tree


def main(argv=None) -> list[list[int]]:
    """``python -m evaluation.fit_tree [--base default] [--head H] [--temperature 0] [--refresh]``: fit (or
    show the cached) tree for a model on this machine, with the model's default fast-CPU setting."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--base", default="default")
    ap.add_argument("--head", default=None)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--verifier", default="rrsw")
    ap.add_argument("--max-nodes", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-draft-vocab", action="store_true", help="ignore the head's draft_vocab.safetensors")
    ap.add_argument("--refresh", action="store_true", help="measure again even if a fit is cached")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        import univer_patch  # noqa: F401  (other verifiers, when installed)
    except ImportError:  # pragma: no cover
        pass
    from eagle.model.ea_model import EaModel

    model = EaModel.from_pretrained(args.base, args.head)
    if args.no_draft_vocab:
        model.ea_layer.set_draft_vocab(None)
    choices = resolve_auto_tree(model, args.temperature, args.top_p, args.top_k, verifier=args.verifier,
                                max_nodes=args.max_nodes, refresh=args.refresh)
    print(choices)
    return choices


if __name__ == "__main__":  # pragma: no cover
    main()
