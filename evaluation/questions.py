"""Spec-Bench questions: locate, verify, load, select, and build chat prompts.

File format (``question.jsonl``, one JSON object per line)::

    {"question_id": int, "category": str, "turns": [str, ...], "reference"?: [...]}

480 questions: ids 81-160 are MT-Bench (sub-categories writing, roleplay, reasoning, math, coding,
extraction, stem, humanities; 10 each, 2 turns each), then 80 single-turn questions each of
``translation``, ``summarization``, ``qa``, ``math_reasoning`` and ``rag``.

Where the file comes from, in this order (:func:`resolve_question_file`):

1. an explicit path (``--question-file PATH``);
2. ``data/spec_bench/question.jsonl`` in this repository (git-ignored);
3. a download from the upstream repository (:data:`SPEC_BENCH_URL`), accepted only if its sha256
   equals :data:`SPEC_BENCH_SHA256`, then saved to (2).

Category groups: the eight MT-Bench sub-categories are reported together as ``"mt_bench"``
(:func:`category_group`); the other categories are their own group.

Selection with ``per_category=N`` (:func:`select_questions`) takes N questions per *group*, in file
order. For ``mt_bench`` the N questions are spread over the eight sub-categories round-robin
(writing, roleplay, reasoning, math, coding, extraction, stem, humanities, then the second question
of each, ...): N=2 gives one writing and one roleplay question, N=8 one of each, N=16 two of each.
Every MT-Bench question has two turns, so an mt_bench question costs about two generations.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterable, Optional, Sequence

__all__ = [
    "SPEC_BENCH_URL", "SPEC_BENCH_SHA256", "DEFAULT_QUESTION_FILE", "MT_BENCH_SUBCATEGORIES",
    "CATEGORY_GROUPS", "QuestionFileError", "fetch_url", "resolve_question_file", "load_questions",
    "category_group", "select_questions", "question_sets", "QUESTION_SETS", "SELECTION_PER_CATEGORY", "build_messages", "build_prompt_ids",
]

SPEC_BENCH_URL = "https://raw.githubusercontent.com/hemingkx/Spec-Bench/main/data/spec_bench/question.jsonl"
SPEC_BENCH_SHA256 = "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04"
DEFAULT_QUESTION_FILE = Path(__file__).resolve().parents[1] / "data" / "spec_bench" / "question.jsonl"

MT_BENCH_SUBCATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
#: report order of the category groups (the paper's Table 1 columns)
CATEGORY_GROUPS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


class QuestionFileError(RuntimeError):
    """The question file is missing and could not be downloaded, or its checksum is wrong."""


def fetch_url(url: str, timeout: float = 30.0) -> bytes:
    """Download ``url`` and return its bytes (a module attribute so tests can replace it).

    Raises:
        urllib.error.URLError / OSError: no network, DNS failure, HTTP error, timeout.
    """
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _options_text(dest: Path) -> str:
    return (f"pass --question-file PATH (a copy of Spec-Bench's data/spec_bench/question.jsonl), "
            f"or copy that file to {dest}")


def resolve_question_file(path: Optional[os.PathLike | str] = None, *, default_path: Optional[Path] = None,
                          download: bool = True, url: str = SPEC_BENCH_URL,
                          sha256: str = SPEC_BENCH_SHA256) -> Path:
    """Return the path of a usable ``question.jsonl`` (see the module docstring for the order).

    Args:
        path: explicit file (``--question-file``); must exist, it is used as is (no checksum check,
            so a subset or a local variant may be given on purpose).
        default_path: where the repository copy lives / the download is saved
            (default :data:`DEFAULT_QUESTION_FILE`).
        download: allow the download when neither file exists.
        url, sha256: download source and its expected sha256 (hex).

    Raises:
        FileNotFoundError: ``path`` given but missing.
        QuestionFileError: no file, and the download is disabled or failed (offline), or the
            downloaded bytes have the wrong sha256 (nothing is kept then). The message names the options.
    """
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"question file {p} does not exist")
        return p
    dest = Path(default_path) if default_path is not None else DEFAULT_QUESTION_FILE
    if dest.is_file():
        return dest
    if not download:
        raise QuestionFileError(f"Spec-Bench questions not found at {dest} and download is disabled: "
                                + _options_text(dest))
    try:
        data = fetch_url(url)
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        raise QuestionFileError(f"Spec-Bench questions not found at {dest} and the download from {url} "
                                f"failed ({e}); offline? " + _options_text(dest)) from e
    digest = _sha256_bytes(data)
    if digest != sha256:
        raise QuestionFileError(f"downloaded {url} has sha256 {digest}, expected {sha256}; the file was "
                                f"not kept. " + _options_text(dest))
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".question.", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, dest)
    return dest


def load_questions(path: os.PathLike | str) -> list[dict]:
    """Read a question JSONL file (blank lines skipped) into a list of dicts, file order kept.

    Raises:
        ValueError: naming ``path:line``: invalid JSON, not an object, a missing ``question_id`` /
            ``category`` / ``turns``, or ``turns`` not a non-empty list of strings.
    """
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                q = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(q, dict):
                raise ValueError(f"{path}:{n}: a question must be a JSON object, got {type(q).__name__}")
            for key in ("question_id", "category", "turns"):
                if key not in q:
                    raise ValueError(f"{path}:{n}: question lacks {key!r}")
            turns = q["turns"]
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
                raise ValueError(f"{path}:{n}: 'turns' must be a non-empty list of strings, got {turns!r:.80}")
            out.append(q)
    return out


def category_group(category: str) -> str:
    """``"mt_bench"`` for the eight MT-Bench sub-categories, else the category itself."""
    return "mt_bench" if category in MT_BENCH_SUBCATEGORIES else category


def _round_robin(questions: Sequence[dict], n: int) -> list[dict]:
    """N MT-Bench questions spread over the sub-categories (round-robin in file sub-category order)."""
    by_sub: dict[str, list[dict]] = {}
    for q in questions:
        by_sub.setdefault(q["category"], []).append(q)
    picked: list[dict] = []
    rank = 0
    while len(picked) < n and any(rank < len(v) for v in by_sub.values()):
        for sub in by_sub:  # dicts keep first-seen (file) order
            if rank < len(by_sub[sub]) and len(picked) < n:
                picked.append(by_sub[sub][rank])
        rank += 1
    return picked


def select_questions(questions: Sequence[dict], categories: Optional[Iterable[str]] = None,
                     per_category: Optional[int] = None) -> list[dict]:
    """Questions of the chosen category groups, at most ``per_category`` per group.

    Args:
        questions: as from :func:`load_questions`.
        categories: group names (``"mt_bench"``, ``"translation"``, ...) or MT-Bench sub-category
            names (``"math"`` selects only that sub-category); ``None`` = all.
        per_category: N questions per group (mt_bench: N in total, round-robin over its
            sub-categories, see the module docstring); ``None`` = all.

    Returns:
        The selected questions, grouped in :data:`CATEGORY_GROUPS` order (unknown groups after, in
        file order), file order inside a group.

    Raises:
        ValueError: an unknown category name, or ``per_category < 1``.
    """
    if per_category is not None and per_category < 1:
        raise ValueError(f"per_category must be >= 1, got {per_category}")
    known_groups = {category_group(q["category"]) for q in questions}
    known = known_groups | {q["category"] for q in questions}
    wanted = None if categories is None else list(categories)
    if wanted is not None:
        bad = [c for c in wanted if c not in known]
        if bad:
            raise ValueError(f"unknown categories {bad}; known: {sorted(known)}")
    groups: dict[str, list[dict]] = {}
    for q in questions:
        g = category_group(q["category"])
        if wanted is not None and g not in wanted and q["category"] not in wanted:
            continue
        groups.setdefault(g, []).append(q)
    order = [g for g in CATEGORY_GROUPS if g in groups] + [g for g in groups if g not in CATEGORY_GROUPS]
    out: list[dict] = []
    for g in order:
        qs = groups[g]
        if per_category is None:
            out.extend(qs)
        elif g == "mt_bench":
            out.extend(_round_robin(qs, per_category))
        else:
            out.extend(qs[:per_category])
    return out


def build_messages(turns: Sequence[str], answers: Sequence[str]) -> list[dict]:
    """Chat messages for the next turn, as in Spec-Bench's multi-turn protocol.

    Turn k's prompt holds turns 1..k-1 with the model's own generated answers, then turn k:
    ``[user t1, assistant a1, user t2, ...]``. Needs ``len(turns) == len(answers) + 1``.
    """
    if len(turns) != len(answers) + 1:
        raise ValueError(f"need one more turn than answers, got {len(turns)} turns, {len(answers)} answers")
    msgs: list[dict] = []
    for t, a in zip(turns[:-1], answers):
        msgs.append({"role": "user", "content": t})
        msgs.append({"role": "assistant", "content": a})
    msgs.append({"role": "user", "content": turns[-1]})
    return msgs


def build_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's chat template, with the generation prompt.

    The template is rendered to text (``apply_chat_template(..., tokenize=False,
    add_generation_prompt=True)``) and tokenised without extra special tokens, since the template
    already writes BOS/role markers.
    """
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    enc = tokenizer(text, add_special_tokens=False)
    ids = enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc
    return list(ids)


#: the head was compared stage to stage on the first 10 questions of each category group (its selection set)
SELECTION_PER_CATEGORY = 10
QUESTION_SETS = ("all", "selection", "report")


def question_sets(questions: Sequence[dict], selection_per_category: int = SELECTION_PER_CATEGORY) -> dict:
    """``{"selection": [...], "report": [...], "all": [...]}``: disjoint selection and report sets.

    selection = :func:`select_questions` with ``per_category=selection_per_category`` (the questions the
    shipped head was compared on, stage to stage); report = every other question, in the same group order
    (so ``per_category`` taken from it never overlaps the selection). Numbers meant to judge a head come
    from the report set.
    """
    sel = select_questions(questions, None, selection_per_category)
    ids = {int(q["question_id"]) for q in sel}
    rest = [q for q in questions if int(q["question_id"]) not in ids]
    return {"selection": sel, "report": select_questions(rest, None, None) if rest else [],
            "all": select_questions(questions, None, None)}
