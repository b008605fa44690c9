"""Target features for head training, recomputed from the token-id corpus and cached outside git.

``python -m eagle.train.features --corpus data/distill --out cache/features [--base default]``

For every corpus shard (``data/distill/<run>/shard_NNNNN.jsonl.gz``, :mod:`eagle.data.corpus`)
one feature shard is written in the format :func:`eagle.train.train.load_sequences` reads
(:mod:`eagle.train.data`): ``input_ids`` int32 ``[T]``, ``loss_mask`` uint8 ``[T]`` (1 on the
target's answer tokens), ``hidden`` float16 ``[T, H]`` (the target's last hidden state after its
final norm), ``offsets`` int64 ``[S + 1]``; one sequence per turn (``prompt_ids + answer_ids``,
cut to ``--max-len`` tokens). Train and held-out records go to ``OUT/train/`` and ``OUT/heldout/``.

Features take ~1.1 KB per token (H = 576, float16), so they are cached on local disk, never
committed; a feature shard newer than its corpus shard and cut at the same ``--max-len`` is reused, so a rerun only adds the new ones.
``--view recall`` writes the recall view instead (:mod:`eagle.train.recall`: each record's first turn
plus a second turn asking for a verbatim copy of earlier text; sequences longer than ``--max-len``
are left out); give it its own ``--out`` and mix it into training with ``--data``.
``--shards 153-158,160-`` encodes only those corpus shard numbers (a warm-started stage that trains on
the shards its parent has not seen). ``--worker I/N`` encodes every N-th corpus shard, so N one-thread processes fill one cache together
(on 2 cores two one-thread workers beat one two-thread process). ``--device cuda`` (the default
``auto`` picks it when present) runs the target there (``--dtype`` float16 / bfloat16 for large
targets); the features are copied back and stored as float16 either way.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

__all__ = ["sequences_of", "build_feature_shard", "record_kinds", "sequence_kinds", "parse_shard_ranges", "main"]

DEFAULT_MAX_LEN = 768
VIEWS = ("answers", "recall")


def sequences_of(rec: dict, max_len: int) -> list[tuple[list[int], list[int]]]:
    """(token ids, loss mask) per turn of a corpus record, cut to ``max_len`` tokens."""
    out = []
    for t in rec["turns"]:
        ids = list(t["prompt_ids"]) + list(t["answer_ids"])
        mask = [0] * len(t["prompt_ids"]) + [1] * len(t["answer_ids"])
        ids, mask = ids[:max_len], mask[:max_len]
        if len(ids) >= 3 and any(mask[1:]):
            out.append((ids, mask))
    return out


def build_feature_shard(model, records: list[dict], *, max_len: int, batch_tokens: int, pad_id: int) -> dict:
    """Feature tensors (module docstring format) for the sequences of ``records``."""
    from .data import _hidden

    seqs = [sm for r in records for sm in sequences_of(r, max_len)]
    hidden: list = [None] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]))
    i = 0
    while i < len(order):
        j = i + 1
        while j < len(order) and (j + 1 - i) * len(seqs[order[j]][0]) <= batch_tokens:
            j += 1
        grp = order[i:j]
        for k, h in zip(grp, _hidden(model, [seqs[k][0] for k in grp], pad_id)):
            hidden[k] = h.to("cpu", torch.float16)
        i = j
    offsets = [0]
    for s, _ in seqs:
        offsets.append(offsets[-1] + len(s))
    H = model.config.hidden_size
    return {
        "input_ids": torch.tensor([t for s, _ in seqs for t in s], dtype=torch.int32),
        "loss_mask": torch.tensor([m for _, ms in seqs for m in ms], dtype=torch.uint8),
        "hidden": torch.cat(hidden, 0).contiguous() if hidden else torch.zeros(0, H, dtype=torch.float16),
        "offsets": torch.tensor(offsets, dtype=torch.int64),
    }


def record_kinds(records: list[dict], max_len: int) -> list[str]:
    """The ``kind`` of the record behind each sequence :func:`build_feature_shard` makes of ``records``."""
    return [str(r.get("kind", "")) for r in records for _ in sequences_of(r, max_len)]


#: the kind given to every sequence of a ``--view recall`` feature shard (for ``--kind-weights``)
RECALL_KIND = "recall"


def sequence_kinds(path: str | os.PathLike, corpus: str | os.PathLike) -> list[str]:
    """The corpus ``kind`` of each sequence of one feature shard (``OUT/{train,heldout}/shard_RUN_NNNNN``).

    The shard's metadata names its corpus shard, view and ``max_len``; the records of that corpus shard
    and split are re-read from ``corpus`` (the corpus root holding ``RUN/``, or the run folder itself)
    and cut into sequences exactly as :func:`main` did (:func:`sequences_of`). Every sequence of a
    recall-view shard gets :data:`RECALL_KIND`.

    Returns:
        One kind string per sequence, in the shard's order (``len == offsets.numel() - 1``).

    Raises:
        ValueError: the corpus shard is missing, or its sequences do not match the feature shard's count
            (the corpus changed after the features were written).
    """
    import gzip

    from safetensors import safe_open

    path = Path(path)
    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata() or {})
        n_seq = int(f.get_slice("offsets").get_shape()[0]) - 1
    if meta.get("view", "answers") == "recall":
        return [RECALL_KIND] * n_seq
    name = meta.get("corpus_shard")
    run = path.stem[len("shard_"):].rsplit("_", 1)[0] if path.stem.startswith("shard_") else ""
    if not name or "max_len" not in meta:
        raise ValueError(f"{path}: feature shard without corpus_shard / max_len metadata (written by an older "
                         "eagle.train.features); kinds cannot be recovered")
    corpus = Path(corpus)
    src = next((c for c in (corpus / run / name, corpus / name) if c.is_file()), None)
    if src is None:
        raise ValueError(f"{path}: its corpus shard {run}/{name} is not under {corpus}")
    split = path.parent.name
    with gzip.open(src, "rt", encoding="utf-8") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    max_len = int(meta["max_len"])
    kinds = record_kinds([r for r in recs if r.get("split", "train") == split], max_len)
    if len(kinds) != n_seq:
        raise ValueError(f"{path}: {n_seq} sequences, but {src} gives {len(kinds)} for split {split!r} at max_len "
                         f"{max_len}; recompute the features of this shard")
    return kinds


def _cached_meta(path: Path) -> tuple[int, str, int | None]:
    """``(--max-len, --view, --recall-seed)`` of a cached feature shard (shards written before they were
    recorded: 768, the default, and ``answers``; the seed is None outside the recall view)."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    seed = meta.get("recall_seed")
    return int(meta.get("max_len", DEFAULT_MAX_LEN)), meta.get("view", "answers"), None if seed is None else int(seed)


def parse_shard_ranges(spec: str) -> list[tuple[int, int | None]]:
    """``--shards`` spec -> inclusive ``(first, last)`` ranges of corpus shard numbers (``last`` None: open).

    ``"153-158,160-"`` -> ``[(153, 158), (160, None)]``; ``"7"`` -> ``[(7, 7)]``; ``""`` -> ``[]`` (all shards).
    Raises ``ValueError`` (message names the bad part) on anything else, e.g. ``"5-3"``, ``"-4"``, ``"a"``.
    """
    ranges: list[tuple[int, int | None]] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        try:
            first = int(lo)
            last = None if dash and not hi.strip() else int(hi if dash else lo)
        except ValueError:
            raise ValueError(f"{part!r} is not N, N-M or N-") from None
        if first < 0 or (last is not None and last < first):
            raise ValueError(f"{part!r} is not a range of shard numbers >= 0")
        ranges.append((first, last))
    return ranges


def _shard_number(path: Path) -> int:
    return int(path.name.split(".")[0].split("_")[1])


def main(argv: list[str] | None = None) -> dict:
    """Command-line entry point; returns a summary (tokens, seconds, tokens/s)."""
    from eagle.data.corpus import DEFAULT_ROOT

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_ROOT), help="corpus folder (data/distill or one run)")
    ap.add_argument("--out", required=True, help="feature cache folder (outside git)")
    ap.add_argument("--base", default="default")
    ap.add_argument("--max-len", type=int, default=DEFAULT_MAX_LEN,
                    help="cut each sequence (prompt + answer) to this many tokens; cached shards cut otherwise are redone")
    ap.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per target forward")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-shards", type=int, default=0, help="at most this many corpus shards (0: all)")
    ap.add_argument("--shards", default="",
                    help="only these corpus shard numbers, e.g. 153-158,160- (those an earlier stage did not train on); default all")
    ap.add_argument("--worker", default="0/1",
                    help="I/N: encode only the corpus shards at positions I mod N (N one-thread processes share a run)")
    ap.add_argument("--view", choices=VIEWS, default="answers",
                    help="answers: the corpus turns as generated; recall: one recall sequence per record "
                         "(eagle.train.recall: a second turn asking for a verbatim copy of earlier text); "
                         "write each view to its own --out")
    ap.add_argument("--recall-seed", type=int, default=0, help="seed of the recall view's choices")
    from .data import DTYPES, add_device_argument, add_fast_cpu_argument, parse_device, parse_worker

    add_fast_cpu_argument(ap)
    add_device_argument(ap, dtype=True)
    args = ap.parse_args(argv)
    worker, n_workers = parse_worker(ap, args.worker)
    device = parse_device(ap, args.device)
    if args.max_len < 3:
        ap.error(f"--max-len must be >= 3 tokens, got {args.max_len}")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        ap.error(f"--out {args.out} is a file, not a folder")
    for p in sorted(Path(args.out).glob("*/shard_*.safetensors")):
        if _cached_meta(p)[1] != args.view:
            ap.error(f"--out {args.out} holds {_cached_meta(p)[1]!r} features ({p.name}); "
                     f"write --view {args.view} to another folder")
    corpus = Path(args.corpus)
    shards = sorted(corpus.rglob("shard_*.jsonl.gz"))
    if not shards:
        ap.error(f"--corpus {corpus}: no shard_*.jsonl.gz found")
    try:
        ranges = parse_shard_ranges(args.shards)
    except ValueError as e:
        ap.error(f"--shards: {e}")
    if ranges:
        shards = [sh for sh in shards
                  if any(lo <= _shard_number(sh) and (hi is None or _shard_number(sh) <= hi) for lo, hi in ranges)]
        if not shards:
            ap.error(f"--shards {args.shards}: no corpus shard under --corpus {corpus} has such a number")
    if args.max_shards:
        shards = shards[:args.max_shards]
    shards = shards[worker::n_workers]
    import gzip

    from safetensors.torch import save_file
    from tqdm import tqdm

    from .data import _pad_id, linears_of, load_base
    from .recall import recall_records

    torch.set_num_threads(args.threads)
    model, tok = load_base(args.base, fast_cpu=args.fast_cpu == "on", device=device, dtype=DTYPES[args.dtype])
    pad = _pad_id(tok)
    out = Path(args.out)
    t0, n_tok, n_new, n_empty = time.time(), 0, 0, 0
    bar = tqdm(shards, desc=f"features {worker}/{n_workers}", unit="shard")
    for sh in bar:
        with gzip.open(sh, "rt", encoding="utf-8") as f:
            recs = [json.loads(line) for line in f if line.strip()]
        run = sh.parent.name
        for split in ("train", "heldout"):
            part = [r for r in recs if r.get("split", "train") == split]
            if not part:
                continue
            dest = out / split / f"shard_{run}_{sh.name.split('.')[0].split('_')[1]}.safetensors"
            seed = args.recall_seed if args.view == "recall" else None
            if (dest.exists() and dest.stat().st_mtime >= sh.stat().st_mtime
                    and _cached_meta(dest) == (args.max_len, args.view, seed)):
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            if args.view == "recall":
                part = recall_records(part, tok, args.recall_seed, args.max_len)
                if not part:
                    n_empty += 1
                    continue
            tensors = build_feature_shard(model, part, max_len=args.max_len, batch_tokens=args.batch_tokens, pad_id=pad)
            tmp = dest.with_name(dest.name + ".tmp")
            save_file(tensors, str(tmp), metadata={"linears": linears_of(model), "corpus_shard": sh.name,
                                                   "max_len": str(args.max_len), "device": device, "view": args.view,
                                                   **({} if seed is None else {"recall_seed": str(seed)}),
                                                   "dtype": args.dtype})
            os.replace(tmp, dest)
            n_tok += int(tensors["input_ids"].numel())
            n_new += 1
        bar.set_postfix(tokens=n_tok, tok_s=round(n_tok / max(time.time() - t0, 1e-9)))
    if n_empty and not n_new and not list(out.glob("*/shard_*.safetensors")):
        raise SystemExit(f"--view recall: no record of the {len(shards)} corpus shard(s) gave a recall sequence "
                         f"within --max-len {args.max_len} (records need a user turn and a non-empty answer)")
    summary = {"corpus_shards": len(shards), "feature_shards_written": n_new, "recall_empty_shards": n_empty, "tokens": n_tok, "linears": linears_of(model),
               "device": device, "dtype": args.dtype,
               "seconds": round(time.time() - t0, 1), "tokens_per_s": round(n_tok / max(time.time() - t0, 1e-9), 1)}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
