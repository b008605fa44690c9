"""Draft vocabulary (FR-Spec / EAGLE-3 style): the K most frequent target tokens, stored beside a head.

``python -m eagle.train.draft_vocab --head eagle/data/heads/smollm2-135m-eagle [--k 8192] [--data data/distill]``

The head's draft law is computed only over these K tokens (the target's lm_head restricted to
their rows) and is zero elsewhere. Verification stays lossless: every verifier handles draft
laws with zeros (a token outside the draft vocabulary is still produced through the residual or
bonus draw over the full target vocabulary); only acceptance can drop, by at most the target mass
outside the K tokens. Drafting gets cheaper: the draft lm_head reads K rows instead of V.

Token counts come from the answers of the self-distillation corpus (``answer_ids`` of
:func:`eagle.data.corpus.iter_records`: what the target itself writes, the tokens drafting has to
predict). When the corpus holds fewer than ``--min-tokens`` answer tokens, the tokenised reference
outputs of ``shared/prompts/alpaca_5000.json`` are counted as well (needs the base tokenizer).

Stored file: ``draft_vocab.safetensors`` with ``d2t`` (int64 ``[K]``, strictly increasing target
token ids; draft index i -> target id ``d2t[i]``) and metadata (K, sources, counted tokens,
coverage of the counted tokens). The head loader picks it up when present
(:meth:`eagle.model.head.EagleHead.set_draft_vocab`); heads without the file are unchanged.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Iterable

import torch

from ..model.head import DRAFT_VOCAB_FILE

__all__ = ["DRAFT_VOCAB_FILE", "count_tokens", "corpus_answer_ids", "alpaca_answer_ids", "top_k_vocab",
           "save_draft_vocab", "load_draft_vocab", "main"]

_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CORPUS = _ROOT / "data" / "distill"


def count_tokens(sequences: Iterable[Iterable[int]], vocab_size: int, counts: torch.Tensor | None = None) -> torch.Tensor:
    """Add the token counts of ``sequences`` to ``counts`` (int64 ``[vocab_size]``, new if None).

    Raises:
        ValueError: a token id outside ``[0, vocab_size)``.
    """
    if counts is None:
        counts = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        ids = torch.as_tensor(list(seq), dtype=torch.long)
        if ids.numel() == 0:
            continue
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"token id {lo if lo < 0 else hi} is outside the vocabulary [0, {vocab_size})")
        counts += torch.bincount(ids, minlength=vocab_size)
    return counts


def corpus_answer_ids(root: str | os.PathLike = DEFAULT_CORPUS) -> Iterable[list[int]]:
    """Every answer's token ids in the self-distillation corpus under ``root`` (train split only;
    both the per-turn record layout and a flat ``answer_ids`` record are read)."""
    root = Path(root)
    if not root.exists():
        return
    from eagle.data.corpus import iter_records

    for rec in iter_records(root):
        if rec.get("split", "train") != "train":
            continue
        turns = rec.get("turns")
        if turns:
            for t in turns:
                yield t.get("answer_ids", [])
        elif "answer_ids" in rec:
            yield rec["answer_ids"]


def alpaca_answer_ids(tokenizer, path: str | os.PathLike | None = None) -> Iterable[list[int]]:
    """Tokenised reference outputs of the Alpaca prompt file (default ``shared/prompts/alpaca_5000.json``
    beside the checkout; no special tokens added)."""
    from eagle.data.corpus import DEFAULT_PROMPTS, load_alpaca

    for r in load_alpaca(path or DEFAULT_PROMPTS):
        if r["output"]:
            yield tokenizer(r["output"], add_special_tokens=False)["input_ids"]


def top_k_vocab(counts: torch.Tensor, k: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The ``k`` most frequent token ids (ties: smaller id first), plus the ids in ``always``
    (e.g. EOS), returned sorted ascending (int64 ``[k']``, k' <= k; tokens never seen are left out).

    Raises:
        ValueError: ``k < 1`` or an ``always`` id outside the vocabulary.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    v = counts.numel()
    forced = sorted({int(i) for i in always})
    for i in forced:
        if not 0 <= i < v:
            raise ValueError(f"always-included token id {i} is outside the vocabulary [0, {v})")
    # order: count descending, id ascending (stable sort on -count)
    order = torch.sort(-counts, stable=True).indices
    seen = order[counts[order] > 0]
    chosen = [i for i in forced]
    forced_set = set(forced)
    need = max(k - len(chosen), 0)
    extra = [int(i) for i in seen.tolist() if int(i) not in forced_set][:need]
    return torch.tensor(sorted(chosen + extra), dtype=torch.long)


def save_draft_vocab(folder: str | os.PathLike, d2t: torch.Tensor, metadata: dict | None = None) -> Path:
    """Write ``<folder>/draft_vocab.safetensors`` (``d2t`` int64 ``[K]``, strictly increasing)."""
    from safetensors.torch import save_file

    d2t = torch.as_tensor(d2t, dtype=torch.long).contiguous()
    if d2t.dim() != 1 or d2t.numel() == 0 or (d2t.numel() > 1 and bool((d2t[1:] <= d2t[:-1]).any())):
        raise ValueError("d2t must be a non-empty 1-D strictly increasing list of token ids")
    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / DRAFT_VOCAB_FILE
    meta = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in (metadata or {}).items()}
    save_file({"d2t": d2t}, str(path), metadata=meta)
    return path


def load_draft_vocab(folder: str | os.PathLike) -> torch.Tensor | None:
    """``d2t`` from ``<folder>/draft_vocab.safetensors``, or None when the file is absent."""
    path = Path(folder) / DRAFT_VOCAB_FILE
    if not path.exists():
        return None
    from safetensors.torch import load_file

    return load_file(str(path))["d2t"]


def _rel(path) -> str:
    """``path`` relative to the checkout (no absolute paths in stored metadata)."""
    return os.path.relpath(Path(path).resolve(), _ROOT)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", required=True, help="head folder; draft_vocab.safetensors is written there")
    ap.add_argument("--base", default="default", help="target (for its vocabulary size, EOS and tokenizer)")
    ap.add_argument("--k", type=int, default=8192, help="draft vocabulary size (default 8192)")
    ap.add_argument("--data", action="append", default=None,
                    help=f"self-distillation corpus folder(s) (default {DEFAULT_CORPUS.relative_to(_ROOT)})")
    ap.add_argument("--min-tokens", type=int, default=500_000,
                    help="below this many corpus answer tokens, Alpaca reference outputs are counted too")
    ap.add_argument("--alpaca", default=None, help="Alpaca JSON (fallback source; default shared/prompts/alpaca_5000.json)")
    ap.add_argument("--out", default=None, help="write here instead of the head folder")
    args = ap.parse_args(argv)

    from transformers import AutoConfig, AutoTokenizer

    base = args.base
    if base in (None, "default"):
        from ..model.default import default_base_folder

        base = str(default_base_folder())
    cfg = AutoConfig.from_pretrained(base)
    vocab = int(cfg.vocab_size)
    counts = torch.zeros(vocab, dtype=torch.long)
    sources = []
    for root in args.data or [str(DEFAULT_CORPUS)]:
        before = int(counts.sum())
        count_tokens(corpus_answer_ids(root), vocab, counts)
        if int(counts.sum()) > before:
            sources.append({"corpus": _rel(root), "tokens": int(counts.sum()) - before})
    from eagle.data.corpus import DEFAULT_PROMPTS

    args.alpaca = args.alpaca or DEFAULT_PROMPTS
    if int(counts.sum()) < args.min_tokens and Path(args.alpaca).exists():
        tok = AutoTokenizer.from_pretrained(base)
        before = int(counts.sum())
        count_tokens(alpaca_answer_ids(tok, args.alpaca), vocab, counts)
        sources.append({"alpaca_outputs": _rel(args.alpaca), "tokens": int(counts.sum()) - before})
    total = int(counts.sum())
    if total == 0:
        raise SystemExit("no tokens counted: no corpus under --data and no Alpaca file")
    eos = cfg.eos_token_id
    always = [eos] if isinstance(eos, int) else list(eos or [])
    d2t = top_k_vocab(counts, args.k, always=always)
    coverage = float(counts[d2t].sum()) / total
    meta = {"k": int(d2t.numel()), "vocab_size": vocab, "sources": sources, "counted_tokens": total,
            "distinct_tokens": int((counts > 0).sum()), "coverage": round(coverage, 6)}
    path = save_draft_vocab(args.out or args.head, d2t, meta)
    print(f"draft vocabulary: {d2t.numel()} of {vocab} tokens cover {100 * coverage:.2f}% of {total} counted tokens "
          f"({meta['distinct_tokens']} distinct) -> {path}")
    return {**meta, "path": str(path)}


if __name__ == "__main__":  # pragma: no cover
    main()
