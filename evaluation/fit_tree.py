"""Fit the static tree to this machine once (``tree_choices="auto"``), or show the cached fit and why.

    python -m evaluation.fit_tree --temperature 0 [--refresh]
    python -m evaluation.fit_tree --write-acceptance [PATH]

The first prints the choice, where its inputs came from and the seconds the fit took (the embedded default
uses its shipped acceptance table, so only this machine's costs are measured: about a minute on 2 busy
cores, an estimated 20-30 s idle). The second measures the head's acceptance tables for
:data:`eagle.autotree.SHIPPED_SETTINGS` (3 x 36 contexts) and writes them (default:
``auto_tree_acceptance.json`` in the head's folder; regenerate it after retraining the default head:
~10 minutes on 2 busy cores).

See :mod:`eagle.autotree` (measurement, cache) and :mod:`eagle.tree.auto` (the exact fit).
"""
from __future__ import annotations

import time

import torch

from eagle.autotree import SHIPPED_ACCEPTANCE, resolve_auto_tree, write_acceptance


def main(argv=None):
    """``python -m evaluation.fit_tree [--base default] [--head H] [--temperature 0] [--refresh]``: fit (or
    show the cached) tree for a model on this machine, with the model's default fast-CPU setting; returns
    the choices. ``--write-acceptance [PATH]``: write the head's acceptance tables instead; returns the path."""
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
    ap.add_argument("--no-shipped", action="store_true",
                    help="measure the acceptance table even where the head ships one")
    ap.add_argument("--write-acceptance", nargs="?", const="", default=None, metavar="PATH",
                    help=f"measure the head's acceptance tables (temperature 0; 1 with univer and rrsw) and write "
                         f"them to PATH (default: {SHIPPED_ACCEPTANCE} in the head folder)")
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
    t0 = time.perf_counter()
    if args.write_acceptance is not None:
        from pathlib import Path

        from eagle.data import DEFAULT_HEAD

        path = args.write_acceptance or Path(args.head or DEFAULT_HEAD) / SHIPPED_ACCEPTANCE
        path = write_acceptance(model, path, progress=True)
        print(f"{path} ({time.perf_counter() - t0:.0f} s)")
        return path
    choices = resolve_auto_tree(model, args.temperature, args.top_p, args.top_k, verifier=args.verifier,
                                max_nodes=args.max_nodes, refresh=args.refresh,
                                shipped=False if args.no_shipped else None)
    print(choices)
    print(f"fit_tree: {time.perf_counter() - t0:.1f} s (model loaded before)")
    return choices


if __name__ == "__main__":  # pragma: no cover
    main()
