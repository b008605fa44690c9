"""Generate Spec-Bench answers with the EAGLE engine (one method per answer file).

A *method* is the plain-decoding baseline ``"naive"`` (``EaModel.naivegenerate``) or any registered
verifier name (``EaModel.eagenerate``); the list of methods comes from the registry
(:func:`evaluation.arguments.method_names`), never from this file.

Answer file: JSON Lines, one question per line, in Spec-Bench's format (its ``evaluation/speed.py``
reads it for every category and "overall")::

    {"question_id": int, "category": str (the question's own category, e.g. "writing"),
     "answer_id": str, "model_id": str,
     "choices": [{"index": 0,
                  "turns": [str, ...],            # generated text per turn
                  "decoding_steps": [int, ...],   # target forwards after the prefill, per turn
                  "new_tokens": [int, ...],       # generated tokens per turn (EOS included)
                  "wall_time": [float, ...],      # seconds per turn (prompt prefill included)
                  "accept_lengths": [int, ...],   # ONE flat list over all turns: tokens appended per
                                                  # target forward (split per turn by decoding_steps)
                  # added keys (ours):
                  "new_token_ids": [[int, ...], ...],        # generated ids per turn
                  "timing": [{part: seconds}, ...],          # engine per-part timing per turn
                  "expected_accept_lengths": [float, ...]}], # flat: exact E[tokens | drafted tree] per cycle
     "tstamp": float (unix seconds),
     # added metadata (ours): run settings and provenance (:func:`provenance`)
     "method", "seed", "temperature", "top_p", "top_k", "tree" (null for naive), "max_new_tokens",
     "expected_tau" (whether the choices carry expected_accept_lengths; --expected-tau),
     "model", "head", "head_sha256": {file: sha256}, "commit", "torch", "transformers", "python",
     "device", "dtype", "threads", "fast_cpu", "draft_vocab", "drafter",
     "drafter_options" (only when the drafter was given options), "prompt_format": {"name", "source", "reason"}}

Timing: ``wall_time`` is the engine's own clock (``stats["wall_time"]``: prefill to the last token,
CUDA synchronised, without the exact-law bookkeeping of ``expected_tau``), the same instrument for
the baseline and every method. Before the timed questions one short warm-up generation runs (not
written).

Randomness: each turn gets its own engine seed ``seed * 1_000_003 + question_id * 16 + turn``
(:func:`call_seed`), so a resumed run draws exactly what an uninterrupted one would.

Resuming: question ids already present in the answer file are skipped; the file's first record must have been
made with the same settings (:data:`RESUME_KEYS`, :func:`resume_settings`, :func:`resume_conflict`), the
drafter's options included, so answers of two draft models never share a file (the command line refuses, naming
the setting, before any work).

Command line (same flags and checks as the main job, :mod:`evaluation.specbench`)::

    python -m evaluation.gen_answer --methods naive rrsw univer --seeds 0 1 2 \\
        --temperature 1.0 --tree 2x5 --per-category 2 --max-new-tokens 128 --out runs/specbench
"""
from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from evaluation.arguments import BASELINE, load_model, resolve_device  # noqa: F401  (re-exported)
from evaluation.questions import build_messages, build_prompt_ids

__all__ = ["BASELINE", "call_seed", "answer_file_name", "resolve_device",
           "load_model", "read_answered_ids", "RESUME_KEYS", "resume_settings", "resume_conflict", "json_options", "generate_turns", "file_sha256", "git_commit", "resolve_head",
           "provenance", "generate_answers", "run", "main"]



def call_seed(seed: int, question_id: int, turn: int) -> int:
    """Engine seed for one turn of one question (deterministic, independent of run order)."""
    return int(seed) * 1_000_003 + int(question_id) * 16 + int(turn)


def _fmt_temp(t: float) -> str:
    return f"{float(t):g}"


def answer_file_name(method: str, temperature: float, tree: Optional[str], seed: int) -> str:
    """``naive-temp1-seed0.jsonl`` for the baseline, ``univer-temp1-2x5-seed0.jsonl`` otherwise."""
    if method == BASELINE or tree is None:
        return f"{method}-temp{_fmt_temp(temperature)}-seed{seed}.jsonl"
    return f"{method}-temp{_fmt_temp(temperature)}-{tree}-seed{seed}.jsonl"


def read_answered_ids(path: os.PathLike | str) -> set[int]:
    """Question ids already in an answer file (empty set if the file does not exist).

    A truncated last line (an interrupted write) is ignored, so that question is redone.
    """
    p = Path(path)
    done: set[int] = set()
    if not p.is_file():
        return done
    with open(p, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                done.add(int(json.loads(line)["question_id"]))
            except (json.JSONDecodeError, KeyError, ValueError):
                continue
    return done


def _sync(device) -> None:
    import torch

    if str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


def _accepted_kwargs(fn) -> set[str]:
    """Keyword names ``fn`` accepts (``{"*"}`` when it takes ``**kwargs``)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set()
    names = {p.name for p in params}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        names.add("*")
    return names


def _generate_once(model, input_ids, method: str, *, temperature: float, top_p: float, top_k: int,
                   max_new_tokens: int, tree: Optional[str], seed: int, on_tokens: Optional[Callable[[int], None]] = None,
                   expected_tau: bool = True):
    """One engine call; returns ``(generated ids list, stats dict, seconds)``.

    ``seconds`` is the engine's ``stats["wall_time"]`` (prefill to last token, CUDA synchronised, without
    the exact-law work of ``expected_tau``), else the wall time measured around the call.
    ``on_tokens(n)`` is passed to the engine as ``progress=`` when the engine supports it.
    """
    kw = dict(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens, seed=seed,
              return_stats=True)
    fn = model.naivegenerate if method == BASELINE else model.eagenerate
    accepted = _accepted_kwargs(fn)
    if on_tokens is not None and "progress" in accepted:
        kw["progress"] = on_tokens
    if method != BASELINE:
        kw.update(tree_choices=tree, verifier=method)
        if expected_tau and "expected_tau" in accepted:
            kw["expected_tau"] = True
    device = getattr(model, "device", "cpu")
    _sync(device)
    t0 = time.perf_counter()
    out_ids, stats = fn(input_ids, **kw)
    _sync(device)
    seconds = time.perf_counter() - t0
    stats = dict(stats or {})
    if "wall_time" in stats:  # the engine's own clock (same sync rules), without its expected-tau work
        seconds = float(stats["wall_time"])
    new_ids = out_ids[0, input_ids.shape[1]:].tolist()
    return new_ids, stats, seconds


def generate_turns(model, tokenizer, question: dict, method: str, *, temperature: float = 1.0,
                   top_p: float = 1.0, top_k: int = 0, max_new_tokens: int = 128,
                   tree: Optional[str] = "2x5", seed: int = 0,
                   prompt_builder: Optional[Callable[[object, list], list]] = None,
                   on_tokens: Optional[Callable[[int], None]] = None, expected_tau: bool = True) -> dict:
    """Answer every turn of ``question``; returns the Spec-Bench ``choices[0]`` dict.

    Turn k's prompt = the prompt format applied to ``[user t1, assistant a1, ..., user tk]`` with the
    model's own answers (:func:`evaluation.questions.build_messages`). ``prompt_builder(tokenizer,
    messages) -> list[int]`` (e.g. ``PromptFormat.ids``) defaults to the tokenizer's chat template.
    ``on_tokens(n)`` is called as tokens are generated (progress bars); after each turn it is topped
    up to ``max_new_tokens`` so a bar sized ``turns x max_new_tokens`` ends full.

    The choice holds Spec-Bench's keys (``accept_lengths`` ONE flat list over all turns) plus
    ``new_token_ids`` (per turn), ``timing`` (per turn, the engine's per-part seconds, when reported)
    and ``expected_accept_lengths`` (flat; only with ``expected_tau`` and when the engine reports them).
    """
    import torch

    build = prompt_builder or build_prompt_ids
    device = getattr(model, "device", "cpu")
    choice = {"index": 0, "turns": [], "decoding_steps": [], "new_tokens": [], "wall_time": [],
              "accept_lengths": [], "new_token_ids": [], "timing": []}
    expected: list[float] = []
    has_expected = True
    for k in range(len(question["turns"])):
        messages = build_messages(question["turns"][: k + 1], choice["turns"])
        ids = build(tokenizer, messages)
        input_ids = torch.tensor([ids], dtype=torch.long, device=device)  # [1, L]
        sent = [0]

        def _tick(n: int) -> None:
            sent[0] += int(n)
            if on_tokens is not None:
                on_tokens(int(n))

        new_ids, stats, seconds = _generate_once(
            model, input_ids, method, temperature=temperature, top_p=top_p, top_k=top_k,
            max_new_tokens=max_new_tokens, tree=tree, seed=call_seed(seed, question["question_id"], k),
            on_tokens=_tick if on_tokens is not None else None, expected_tau=expected_tau)
        if on_tokens is not None and sent[0] < max_new_tokens:
            on_tokens(max_new_tokens - sent[0])
        n_new = int(stats.get("new_tokens", len(new_ids)))
        accept = [int(a) for a in stats.get("accept_lengths", [1] * max(n_new - 1, 0))]
        steps = int(stats.get("decoding_steps", len(accept)))
        text = tokenizer.decode(new_ids, skip_special_tokens=True).strip()
        choice["turns"].append(text)
        choice["decoding_steps"].append(steps)
        choice["new_tokens"].append(n_new)
        choice["wall_time"].append(float(seconds))
        choice["accept_lengths"].extend(accept)
        choice["new_token_ids"].append([int(t) for t in new_ids])
        choice["timing"].append({k2: float(v) for k2, v in (stats.get("timing") or {}).items()})
        if method == BASELINE and expected_tau:
            expected.extend([1.0] * len(accept))
        elif expected_tau and "expected_accept_lengths" in stats:
            expected.extend(float(x) for x in stats["expected_accept_lengths"][: len(accept)])
        else:
            has_expected = False
    if has_expected:
        choice["expected_accept_lengths"] = expected
    if not any(choice["timing"]):
        del choice["timing"]
    return choice


def _head_files(head: Optional[str]) -> list[Path]:
    if head is None:
        return []
    p = Path(str(head))
    if p.is_dir():
        return sorted(f for f in p.iterdir() if f.is_file() and (
            f.suffix == ".safetensors" or f.name.startswith("pytorch_model") and f.suffix == ".bin"))
    try:  # a hub id already in the local cache
        from huggingface_hub import try_to_load_from_cache

        for name in ("model.safetensors", "pytorch_model.bin"):
            f = try_to_load_from_cache(str(head), name)
            if isinstance(f, str):
                return [Path(f)]
    except Exception:  # noqa: BLE001 - provenance must never stop a run
        pass
    return []


_SHA_CACHE: dict[str, str] = {}


def file_sha256(path: os.PathLike | str) -> str:
    """sha256 (hex) of a file, computed once per process per path."""
    import hashlib

    key = str(Path(path).resolve())
    if key not in _SHA_CACHE:
        h = hashlib.sha256()
        with open(key, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _SHA_CACHE[key] = h.hexdigest()
    return _SHA_CACHE[key]


def git_commit(repo: os.PathLike | str = Path(__file__).resolve().parents[1]) -> Optional[str]:
    """``HEAD`` commit of the source tree (``+dirty`` when tracked files differ from it), None outside git."""
    import subprocess

    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        if not sha:
            return None
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=repo, capture_output=True,
                               timeout=10).returncode != 0
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def resolve_head(model_name: str, head: Optional[str]) -> Optional[str]:
    """The head actually used: ``head``, or the shipped default head for the default model."""
    if head is None and str(model_name) in ("default", "None"):
        from eagle.model.default import DEFAULT_HEAD

        return DEFAULT_HEAD
    return None if head is None else str(head)


def _draft_vocab_size(model) -> Optional[int]:
    """K of the head's draft vocabulary in use, None when it drafts over the full vocabulary."""
    d2t = getattr(getattr(model, "ea_layer", None), "d2t", None)
    return None if d2t is None else int(d2t.numel())


def json_options(options: Optional[dict]) -> dict:
    """A drafter's options in JSON form (the answer records' ``drafter_options``): numbers, strings, booleans,
    None, lists and dicts as they are, a path as text, a torch dtype as its name (``"torch.float16"``), anything
    else (a loaded model) as ``"<ClassName>"``."""
    import torch

    def conv(v):
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {str(k): conv(x) for k, x in v.items()}
        if isinstance(v, os.PathLike):
            return os.fspath(v)
        if isinstance(v, torch.dtype):
            return str(v)
        return f"<{type(v).__name__}>"

    return {str(k): conv(v) for k, v in (options or {}).items()}


def provenance(model, model_name: str = "default", head: Optional[str] = None, prompt_format=None,
               drafter_options: Optional[dict] = None) -> dict:
    """What produced an answer file: model, head path + sha256 of its weight files, commit, versions,
    dtype, device, torch threads, the engine's fast CPU linears flag, drafter, prompt format. JSON-ready.

    ``drafter_options`` (the options the model's drafter was built with, e.g. ``--drafter-option``) are recorded
    as ``"drafter_options"`` (:func:`json_options`) only when there are some: records of a drafter without
    options keep exactly the keys they had before."""
    import platform

    import torch
    import transformers

    head_used = resolve_head(model_name, head)
    dtype = getattr(model, "dtype", None) or getattr(getattr(model, "base_model", None), "dtype", None)
    return {
        "model": str(model_name), "head": head_used,
        "head_sha256": {f.name: file_sha256(f) for f in _head_files(head_used)},
        "commit": git_commit(), "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "device": str(getattr(model, "device", "cpu")),
        "dtype": None if dtype is None else str(dtype), "threads": int(torch.get_num_threads()),
        "fast_cpu": getattr(model, "fast_cpu", None),
        "draft_vocab": _draft_vocab_size(model),
        "drafter": getattr(getattr(model, "drafter", None), "name", None),
        **({"drafter_options": json_options(drafter_options)} if drafter_options else {}),
        "prompt_format": None if prompt_format is None else prompt_format.describe(),
    }


#: settings that must match for answers to be appended to an existing file (resuming)
RESUME_KEYS = ("model", "head", "max_new_tokens", "top_p", "top_k", "temperature", "tree", "tree_choices", "seed",
               "method", "draft_vocab", "drafter", "drafter_options")


def resume_settings(info: dict, method: str, *, seed: int, temperature: float, top_p: float, top_k: int,
                    max_new_tokens: int, tree: Optional[str], tree_choices: Optional[list] = None) -> dict:
    """The settings an answer file of ``method`` must share with this run to be appended to
    (:func:`resume_conflict`).

    Args:
        info: :func:`provenance` of the run (model, head, prompt format, draft vocabulary, drafter and options).
        method: ``"naive"`` or a verifier; seed, temperature, top_p, top_k, max_new_tokens: the run's.
        tree: the tree label (ignored for naive); tree_choices: its resolved rank paths (``"auto"``) or None.

    Returns:
        A dict of :data:`RESUME_KEYS` (plus ``prompt_format``). The drafter is part of it for verifiers only (plain
        decoding does not draft); ``drafter_options`` only when the run's drafter has options.
    """
    tree = None if method == BASELINE else tree
    d = {"model": info["model"], "head": info["head"], "max_new_tokens": max_new_tokens, "top_p": top_p,
         "top_k": top_k, "temperature": temperature, "tree": tree, "seed": seed, "method": method,
         "prompt_format": info.get("prompt_format"), "draft_vocab": info.get("draft_vocab")}
    if tree is not None and tree_choices is not None:
        d["tree_choices"] = tree_choices
    if method != BASELINE:
        d["drafter"] = info.get("drafter")
        if info.get("drafter_options"):
            d["drafter_options"] = info["drafter_options"]
    return d


def resolve_tree_choices(model, cfg, tree: Optional[str] = None) -> Optional[list]:
    """The rank paths of ``tree`` (default ``cfg.tree``) when it is ``"auto"`` (fitted once per machine
    and cached, :meth:`EaModel.resolve_tree`; prints the choice and why), else None (a named tree)."""
    if (cfg.tree if tree is None else tree) != "auto":
        return None
    choices = model.resolve_tree("auto", cfg.temperature, cfg.top_p, cfg.top_k)
    return [[int(r) for r in path] for path in choices]  # as the answer records store it (JSON lists)


def resume_conflict(path: os.PathLike | str, settings: dict) -> Optional[str]:
    """Why answers with ``settings`` must not be appended to the existing file ``path`` (None if they may).

    Compares :data:`RESUME_KEYS` and the prompt format's name with the file's first record; a key absent from
    either side is not compared, except ``drafter_options`` where both name a ``drafter`` (no options there =
    none: a file of one draft model never takes another's answers).
    """
    p = Path(path)
    if not p.is_file():
        return None
    with open(p, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            diff = [k for k in RESUME_KEYS if k in settings and k in rec and rec[k] != settings[k]]
            if ("drafter" in settings and "drafter" in rec and "drafter_options" not in diff
                    and (rec.get("drafter_options") or None) != (settings.get("drafter_options") or None)):
                diff.append("drafter_options")
            fmt_old = (rec.get("prompt_format") or {}).get("name")
            fmt_new = (settings.get("prompt_format") or {}).get("name")
            if fmt_old and fmt_new and fmt_old != fmt_new:
                diff.append("prompt_format")
            if diff:
                return (f"{p} holds answers made with " + ", ".join(f"{k}={rec.get(k)!r}" for k in diff)
                        + " (this run: " + ", ".join(f"{k}={settings.get(k)!r}" for k in diff) + ")")
            return None
    return None


def generate_answers(model, questions: Sequence[dict], answer_file: os.PathLike | str, method: str, *,
                     temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, tree: Optional[str] = "2x5",
                     seed: int = 0, max_new_tokens: int = 128, model_name: str = "default",
                     head: Optional[str] = None, tokenizer=None, warmup: bool = True, progress: bool = True,
                     prompt_builder: Optional[Callable] = None, prompt_format=None,
                     expected_tau: bool = True, run_info: Optional[dict] = None,
                     tree_choices: Optional[list] = None) -> int:
    """Append answers of ``method`` for the questions not yet in ``answer_file``.

    Args:
        model: an ``EaModel`` (or any object with ``eagenerate``/``naivegenerate``/``device``).
        questions: selected questions (:func:`evaluation.questions.select_questions`).
        answer_file: JSONL output (created with its folder; existing ids are skipped).
        method: ``"naive"`` or a registered verifier name.
        temperature, top_p, top_k: sampling processing (0 temperature = greedy).
        tree: tree spec passed to the engine (``"2x5"``, ``"mc_sim_7b_63"``, ...); ignored for naive.
        seed: run seed (see :func:`call_seed`).
        max_new_tokens: cap per turn (tokens).
        model_name, head: ``--model`` / ``--head`` values (provenance).
        tokenizer: defaults to ``model.tokenizer``.
        warmup: run one short untimed generation first (only if something is to be generated).
        progress: a tqdm bar in tokens (moves within a question).
        prompt_builder: ``(tokenizer, messages) -> ids``; defaults to ``prompt_format.ids`` or the chat template.
        prompt_format: :class:`evaluation.templates.PromptFormat` (recorded in the file).
        expected_tau: ask the engine for the exact expected tokens per cycle (when it supports it; outside
            the timed region); recorded as ``"expected_tau"`` in every record. Off: the choices have no
            ``expected_accept_lengths`` and the tables leave the Rao-Blackwellised tau out.
        run_info: extra provenance (computed once by the caller; default :func:`provenance`).
        tree_choices: the resolved rank paths when ``tree`` is a label the engine resolves itself
            (``"auto"``): the engine gets the list (no fitting inside the timed calls), the records keep
            the label in ``tree`` and the list in ``tree_choices``.

    Returns:
        Number of questions written by this call.
    """
    from tqdm import tqdm

    tok = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tok is None:
        raise ValueError("no tokenizer: pass tokenizer= or use a model with .tokenizer")
    if prompt_builder is None and prompt_format is not None:
        prompt_builder = prompt_format.ids
    tree_used = None if method == BASELINE else tree
    path = Path(answer_file)
    done = read_answered_ids(path)
    todo = [q for q in questions if int(q["question_id"]) not in done]
    if not todo:
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    engine_tree = tree_choices if (tree_used is not None and tree_choices is not None) else tree_used
    gen_kw = dict(temperature=temperature, top_p=top_p, top_k=top_k, tree=engine_tree,
                  prompt_builder=prompt_builder, expected_tau=expected_tau)
    if warmup:
        warm_q = {"question_id": 0, "turns": todo[0]["turns"][:1]}  # untimed, not written
        generate_turns(model, tok, warm_q, method, max_new_tokens=min(16, max_new_tokens), seed=seed, **gen_kw)
    info = dict(run_info) if run_info is not None else provenance(model, model_name, head, prompt_format)
    drafter = info.get("drafter")
    shown = f"{method}+{drafter}" if method != BASELINE and drafter not in (None, "eagle") else method
    model_id = f"{Path(str(model_name)).name}-{shown}-temp{_fmt_temp(temperature)}" + (
        f"-{tree_used}" if tree_used else "")
    written = 0
    label = f"{shown} T={_fmt_temp(temperature)}" + (f" {tree_used}" if tree_used else "") + f" seed={seed}"
    total = sum(len(q["turns"]) for q in todo) * int(max_new_tokens)
    bar = tqdm(total=total, desc=label, disable=not progress, unit="tok", dynamic_ncols=True)
    try:
        with open(path, "a", encoding="utf-8") as f:
            for i, q in enumerate(todo):
                bar.set_postfix_str(f"question {i + 1}/{len(todo)}", refresh=False)
                choice = generate_turns(model, tok, q, method, max_new_tokens=max_new_tokens, seed=seed,
                                        on_tokens=bar.update, **gen_kw)
                rec = {
                    "question_id": q["question_id"], "category": q["category"], "answer_id": uuid.uuid4().hex,
                    "model_id": model_id, "choices": [choice], "tstamp": time.time(),
                    **info, "method": method, "seed": int(seed), "temperature": float(temperature),
                    "top_p": float(top_p), "top_k": int(top_k), "tree": tree_used,
                    "max_new_tokens": int(max_new_tokens), "expected_tau": bool(expected_tau),
                }
                if tree_used is not None and tree_choices is not None:
                    rec["tree_choices"] = tree_choices
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                f.flush()
                written += 1
    finally:
        bar.close()
    return written


def run(model, questions: Sequence[dict], out_dir: os.PathLike | str, methods: Iterable[str],
        seeds: Iterable[int], *, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
        tree: str = "2x5", max_new_tokens: int = 128, model_name: str = "default", head: Optional[str] = None,
        tokenizer=None, progress: bool = True, prompt_builder: Optional[Callable] = None, prompt_format=None,
        run_info: Optional[dict] = None, tree_choices: Optional[list] = None,
        interleave: bool = True, expected_tau: bool = True) -> list[Path]:
    """Every (method, seed) pair with one loaded model; returns the answer files (see
    :func:`answer_file_name`), which live in ``out_dir``. Provenance is computed once.

    ``interleave`` (default): per seed, question by question, every method answers the question
    before the next one starts (round-robin), so a machine that speeds up or slows down during the
    run (shared CPUs do) moves every method's tokens/s alike and the speedups stay paired; the
    progress bar then counts answers. False: each method answers all questions in turn (one
    token-level bar per method). Files and records are the same either way. ``expected_tau``: see
    :func:`generate_answers` (resolve ``--expected-tau`` with :func:`evaluation.arguments.expected_tau_on`).
    """
    from tqdm import tqdm

    if run_info is None:
        run_info = provenance(model, model_name, head, prompt_format)
    files = []
    common = dict(temperature=temperature, top_p=top_p, top_k=top_k, tree=tree, max_new_tokens=max_new_tokens,
                  model_name=model_name, head=head, tokenizer=tokenizer, prompt_builder=prompt_builder,
                  prompt_format=prompt_format, run_info=run_info, tree_choices=tree_choices,
                  expected_tau=expected_tau)
    for seed in seeds:
        paths = {m: Path(out_dir) / answer_file_name(m, temperature, tree, seed) for m in methods}
        files.extend(paths.values())
        if not interleave or len(paths) == 1:
            for method, p in paths.items():
                generate_answers(model, questions, p, method, seed=seed, progress=progress, **common)
            continue
        warmed: set = set()
        bar = tqdm(total=len(questions) * len(paths), disable=not progress, unit="answer", dynamic_ncols=True,
                   desc=f"{', '.join(paths)} interleaved T={_fmt_temp(temperature)} seed={seed}")
        try:
            for q in questions:
                for method, p in paths.items():
                    if generate_answers(model, [q], p, method, seed=seed, progress=False,
                                        warmup=method not in warmed, **common):
                        warmed.add(method)  # resuming: warm up before the first question actually answered
                    bar.update(1)
        finally:
            bar.close()
    return files


def main(argv: Optional[Sequence[str]] = None) -> list[Path]:
    """``python -m evaluation.gen_answer``: answers only (same flags and checks as the main job; the
    baseline runs only when ``naive`` is among ``--methods``)."""
    from evaluation.arguments import (OneLineParser, UsageError, add_common_arguments, check_arguments,
                                      exit_on_usage_error, expected_tau_on, load_checked_model)

    ap = OneLineParser(prog="gen_answer", description="Generate Spec-Bench answers (baseline 'naive' and verifiers).")
    add_common_arguments(ap)
    ap.add_argument("--answer-file", default=None, help="explicit output file (only with one method and one seed)")
    args = ap.parse_args(argv)
    cfg = exit_on_usage_error(check_arguments, args, prog="gen_answer")
    if args.answer_file and (len(cfg.methods) != 1 or len(cfg.seeds) != 1):
        exit_on_usage_error(lambda: (_ for _ in ()).throw(
            UsageError("--answer-file", "needs exactly one method and one seed")), prog="gen_answer")

    def check_resume(info: dict, choices, known_only: bool) -> None:
        """Every existing answer file of this run must come from the same settings (one line, exit 2)."""
        for seed in cfg.seeds:
            for m in cfg.methods:
                path = Path(args.answer_file) if args.answer_file else cfg.out / "answers" / answer_file_name(
                    m, cfg.temperature, cfg.tree, seed)
                settings = resume_settings(info, m, seed=seed, temperature=cfg.temperature, top_p=cfg.top_p,
                                           top_k=cfg.top_k, max_new_tokens=cfg.max_new_tokens, tree=cfg.tree,
                                           tree_choices=choices)
                if known_only:  # before loading: what the loaded model decides is not known yet
                    for k in ("prompt_format", "draft_vocab", "tree_choices"):
                        settings.pop(k, None)
                why = resume_conflict(path, settings)
                if why:
                    flag = "--answer-file" if args.answer_file else "--out"
                    exit_on_usage_error(lambda: (_ for _ in ()).throw(
                        UsageError(flag, f"{why}; use another {flag} or delete that file")), prog="gen_answer")

    # first from the flags alone (before loading anything), then with what the loaded model says
    check_resume({"model": str(cfg.model), "head": resolve_head(cfg.model, cfg.head), "drafter": cfg.drafter,
                  **({"drafter_options": json_options(cfg.drafter_options)} if cfg.drafter_options else {})},
                 None, known_only=True)
    model, fmt = exit_on_usage_error(load_checked_model, cfg, prog="gen_answer")
    info = provenance(model, cfg.model, cfg.head, fmt, drafter_options=cfg.drafter_options)
    choices = resolve_tree_choices(model, cfg)
    check_resume(info, choices, known_only=False)
    kw = dict(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, tree=cfg.tree,
              max_new_tokens=cfg.max_new_tokens, model_name=cfg.model, head=cfg.head, progress=not cfg.no_progress,
              prompt_format=fmt, run_info=info, tree_choices=choices,
              expected_tau=expected_tau_on(cfg.expected_tau, model.device))
    if args.answer_file:
        generate_answers(model, cfg.questions, args.answer_file, cfg.methods[0], seed=cfg.seeds[0], **kw)
        return [Path(args.answer_file)]
    return run(model, cfg.questions, cfg.out / "answers", cfg.methods, cfg.seeds, **kw)


if __name__ == "__main__":
    main()
