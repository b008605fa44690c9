"""Readers of the stored prompts and answers: the self-distillation corpus and the Alpaca prompt file.

The corpus (``data/distill/<run>/shard_NNNNN.jsonl.gz``, built by ``research/corpus.py``) holds the
target's own answers as token ids, one JSON record per line::

    {"uid": "translation-17", "source": "fortunes-de", "kind": "translation", "split": "train",
     "messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}, ...],
     "turns": [{"prompt_ids": [int, ...], "answer_ids": [int, ...], "stopped_eos": bool}, ...],
     "temperature": 0.0, "top_p": 1.0, "seed": int, "max_new_tokens": 256, "model": "...",
     "linears": "onednn-packed" | "eager", "device": "cpu" | "cuda"}

``turns[t].prompt_ids`` is the chat-template encoding of the conversation up to user turn t (with the
generation prompt, :func:`encode_chat`), ``answer_ids`` what the target generated. Shards ``k % 40 == 39``
and ``k % 80 == 38`` are held out (``"split": "heldout"``, :func:`is_heldout`): never trained on.

Inference (:mod:`eagle.autotree`), evaluation and training read these files through this module; none
of them needs the corpus builder.
"""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Iterator

__all__ = ["DEFAULT_ROOT", "DEFAULT_RUN", "HELDOUT_EVERY", "is_heldout", "iter_records", "answer_token_count",
           "write_shard", "encode_chat", "SHARED", "DEFAULT_PROMPTS", "DEFAULT_SPECBENCH", "load_alpaca"]

#: the committed corpus of a source checkout (absent from an installed package)
DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "data" / "distill"
HELDOUT_EVERY = 40
#: the run whose held-out records are the fixed held-out set of every head comparison
DEFAULT_RUN = "smollm2-135m"
#: ``shared/`` next to the repository checkout (the team's data folder; pass --prompts / --specbench otherwise)
SHARED = Path(__file__).resolve().parents[3] / "shared"
DEFAULT_PROMPTS = str(SHARED / "prompts" / "alpaca_5000.json")
DEFAULT_SPECBENCH = str(SHARED / "specbench" / "question.jsonl")


def is_heldout(k: int) -> bool:
    """Shard ``k`` is held out: ``k % 40 == 39`` (a sampled shard) or ``k % 80 == 38`` (a greedy one)."""
    return k % HELDOUT_EVERY == HELDOUT_EVERY - 1 or k % (2 * HELDOUT_EVERY) == HELDOUT_EVERY - 2


def iter_records(root: str | os.PathLike = DEFAULT_ROOT, split: str | None = None) -> Iterator[dict]:
    """Every record of every ``shard_*.jsonl.gz`` under ``root`` (recursively), in path order.

    Args:
        root: the corpus folder (default ``data/distill``) or one run folder.
        split: ``"train"`` / ``"heldout"`` to keep one split, None for all.
    """
    for path in sorted(Path(root).rglob("shard_*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    rec = json.loads(line)
                    if split is None or rec.get("split") == split:
                        yield rec


def answer_token_count(rec: dict) -> int:
    """Number of target-generated tokens in a record (all turns)."""
    return sum(len(t["answer_ids"]) for t in rec["turns"])


def write_shard(path: str | os.PathLike, records: list[dict]) -> None:
    """Write records as one gzip JSONL file atomically (temporary name, then rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as f:
        for r in records:
            f.write(json.dumps(r, separators=(",", ":"), ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def encode_chat(tok, messages: list[dict]) -> list[int]:
    """Chat-template token ids of ``messages`` with the generation prompt (what the target sees)."""
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(enc, list):
        enc = enc["input_ids"]
    return [int(t) for t in enc]


def load_alpaca(path: str | os.PathLike) -> list[dict]:
    """Alpaca-style records -> ``[{"id": int, "prompt": str, "output": str}]``.

    ``prompt`` = instruction, plus ``"\\n\\n" + input`` when the input is not empty; ``id`` is the
    record's index in the file.
    """
    with open(path) as f:
        recs = json.load(f)
    out = []
    for i, r in enumerate(recs):
        prompt = r["instruction"].strip()
        if r.get("input", "").strip():
            prompt += "\n\n" + r["input"].strip()
        out.append({"id": i, "prompt": prompt, "output": r.get("output", "").strip()})
    return out
