"""Weight averaging of draft heads that share one architecture (checkpoint averaging, a "model soup").

``python -m eagle.train.average --heads A,B[,C...] [--weights 0.5,0.5] --out DIR``

Every tensor of ``model.safetensors`` becomes ``sum_i w_i * theta_i`` (computed in float32, stored in the
first head's dtype per tensor); ``config.json`` and ``draft_vocab.safetensors`` are copied from the first
head after checking that every head has the same ones. Averaging only makes sense for heads on one
training path (e.g. a head and its warm-started continuation): their weights sit in one basin, and the
average usually generalises better than either end point. Whether it did is for
:mod:`research.heldout` and the tau measurement to say; this tool only does the arithmetic.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..model.head import DRAFT_VOCAB_FILE as VOCAB_FILE
from ..model.head import WEIGHT_FILES

__all__ = ["average_state_dicts", "average_heads", "main"]

MODEL_FILE = WEIGHT_FILES[0]  # model.safetensors, the layout heads are saved in
CONFIG_FILE = "config.json"


def _check_weights(weights: list[float], n_heads: int) -> None:
    if not n_heads:
        raise ValueError("average: no heads given")
    if len(weights) != n_heads:
        raise ValueError(f"average: {len(weights)} weights for {n_heads} heads")
    w = torch.tensor(weights, dtype=torch.float64)
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()) or abs(float(w.sum()) - 1.0) > 1e-6:
        raise ValueError(f"average: weights must be finite, >= 0 and sum to 1, got {weights}")


def average_state_dicts(states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """Weighted mean of state dicts with identical keys and shapes.

    Args:
        states: ``n >= 1`` state dicts (name -> floating tensor of any shape).
        weights: ``n`` finite non-negative floats summing to 1 (within 1e-6).
    Returns:
        name -> ``sum_i weights[i] * states[i][name]``, accumulated in float32 and cast to the dtype of
        ``states[0][name]``.
    Raises:
        ValueError: on no states, a weight count that differs from the state count, weights that are not
            finite, negative or do not sum to 1, differing key sets, differing shapes, or a non-floating tensor.
    """
    _check_weights(weights, len(states))
    keys = set(states[0])
    for i, s in enumerate(states[1:], 1):
        if set(s) != keys:
            diff = sorted(keys.symmetric_difference(s))[:3]
            raise ValueError(f"average: head {i} has different tensors than head 0 (e.g. {diff})")
    out = {}
    for k in sorted(keys):
        first = states[0][k]
        if not first.is_floating_point():
            raise ValueError(f"average: tensor {k!r} is {first.dtype}, not floating point")
        acc = torch.zeros(first.shape, dtype=torch.float32)
        for i, (s, wi) in enumerate(zip(states, weights)):
            if s[k].shape != first.shape:
                raise ValueError(f"average: tensor {k!r} is {tuple(s[k].shape)} in head {i}, "
                                 f"{tuple(first.shape)} in head 0")
            acc += float(wi) * s[k].float()
        out[k] = acc.to(first.dtype).contiguous()
    return out


def average_heads(heads: list[str | Path], out: str | Path, weights: list[float] | None = None) -> Path:
    """Average head folders (public EAGLE-1 layout) into ``out`` (see :func:`average_state_dicts`).

    Raises:
        FileNotFoundError: a head folder lacks ``model.safetensors`` or ``config.json``.
        ValueError: configs or draft vocabularies differ, ``out`` is one of the heads, or the weights /
            tensors do not match (as in :func:`average_state_dicts`).
    """
    heads = [Path(h) for h in heads]
    out = Path(out)
    weights = weights if weights is not None else [1.0 / len(heads)] * len(heads)
    _check_weights(weights, len(heads))  # before any file is read
    for h in heads:
        for f in (MODEL_FILE, CONFIG_FILE):
            if not (h / f).is_file():
                raise FileNotFoundError(f"average: head {h} has no {f}")
        if out.resolve() == h.resolve():
            raise ValueError(f"average: --out {out} is one of the heads")
    cfg0 = json.loads((heads[0] / CONFIG_FILE).read_text())
    for h in heads[1:]:
        if json.loads((h / CONFIG_FILE).read_text()) != cfg0:
            raise ValueError(f"average: {h}/{CONFIG_FILE} differs from {heads[0]}/{CONFIG_FILE}")
    has_vocab = [(h / VOCAB_FILE).is_file() for h in heads]
    if any(has_vocab):
        if not all(has_vocab):
            raise ValueError(f"average: only some heads have {VOCAB_FILE}")
        v0 = load_file(str(heads[0] / VOCAB_FILE))
        for h in heads[1:]:
            v = load_file(str(h / VOCAB_FILE))
            if v.keys() != v0.keys() or any(not torch.equal(v[k], v0[k]) for k in v0):
                raise ValueError(f"average: {h}/{VOCAB_FILE} differs from {heads[0]}/{VOCAB_FILE}")
    state = average_state_dicts([load_file(str(h / MODEL_FILE)) for h in heads], weights)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / MODEL_FILE), metadata={"format": "pt"})
    shutil.copyfile(heads[0] / CONFIG_FILE, out / CONFIG_FILE)
    if any(has_vocab):
        shutil.copyfile(heads[0] / VOCAB_FILE, out / VOCAB_FILE)
    (out / "average.json").write_text(json.dumps({"heads": [str(h) for h in heads], "weights": weights}, indent=1))
    return out


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", required=True, help="comma-separated head folders with one architecture")
    ap.add_argument("--weights", default="", help="comma-separated weights summing to 1 (default: equal)")
    ap.add_argument("--out", required=True, help="folder for the averaged head")
    args = ap.parse_args(argv)
    heads = [h for h in args.heads.split(",") if h]
    if len(heads) < 2:
        ap.error("--heads: give at least two head folders")
    weights = None
    if args.weights:
        try:
            weights = [float(x) for x in args.weights.split(",")]
        except ValueError:
            ap.error(f"--weights: not a list of numbers: {args.weights!r}")
        if len(weights) != len(heads):
            ap.error(f"--weights: {len(weights)} weights for {len(heads)} heads")
    try:
        out = average_heads(heads, args.out, weights)
    except (FileNotFoundError, ValueError) as e:
        ap.error(str(e))
    print(f"wrote {out}/{MODEL_FILE} (mean of {len(heads)} heads)")
    return out


if __name__ == "__main__":
    main()
