"""Generate Spec-Bench answers with the EAGLE engine (one method per answer file).

A *method* is the autoregressive baseline ``"naive"`` (``EaModel.naivegenerate``) or a verifier
name (``"rrsw"``, ``"traversal"``, ``"greedy"``, ``"univer"``; ``EaModel.eagenerate``).

Answer file: JSON Lines, one question per line, Spec-Bench compatible::

    {"question_id": int, "category": str (the question's own category, e.g. "writing"),
     "answer_id": str, "model_id": str,
     "choices": [{"index": 0,
                  "turns": [str, ...],            # generated text per turn
                  "decoding_steps": [int, ...],   # target forwards after the prefill, per turn
                  "new_tokens": [int, ...],       # generated tokens per turn (EOS included)
                  "wall_time": [float, ...],      # seconds per turn (prompt prefill included)
                  "accept_lengths": [[int, ...], ...]}],  # per turn: tokens appended per target forward
     "tstamp": float (unix seconds),
     # metadata (ours):
     "model", "head", "method", "seed", "temperature", "top_p", "top_k", "tree" (null for naive),
     "max_new_tokens", "device", "dtype"}

Timing: ``wall_time`` is measured here around each generate call (``time.perf_counter``, with a CUDA
synchronise before and after on GPUs), so the baseline and every method are timed the same way.
Before the timed questions one short warm-up generation runs (not written).

Randomness: each turn gets its own engine seed ``seed * 1_000_003 + question_id * 16 + turn``
(:func:`call_seed`), so a resumed run draws exactly what an uninterrupted one would.

Resuming: question ids already present in the answer file are skipped.

Command line (one or more methods and seeds; the model is loaded once)::

    python -m evaluation.gen_answer --methods naive rrsw univer --seeds 0 1 2 \\
        --temperature 1.0 --tree 2x5 --per-category 2 --max-new-tokens 128 --out runs/specbench
"""
from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from evaluation.questions import (build_messages, build_prompt_ids, load_questions, resolve_question_file,
                                  select_questions)

__all__ = ["BASELINE", "DEFAULT_METHODS", "call_seed", "answer_file_name", "resolve_device",
           "load_model", "read_answered_ids", "generate_turns", "generate_answers", "run", "main"]

BASELINE = "naive"
DEFAULT_METHODS = ("rrsw", "traversal", "greedy", "univer")


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


def resolve_device(device: str = "auto", dtype: str = "auto"):
    """``(device, torch dtype)``: ``auto`` = CUDA with float16 when available, else CPU with float32."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dt = torch.float16 if str(device).startswith("cuda") else torch.float32
    else:
        dt = {"float16": torch.float16, "fp16": torch.float16, "bfloat16": torch.bfloat16,
              "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}[dtype]
    return device, dt


def load_model(base_model: str = "default", head: Optional[str] = None, device: str = "auto",
               dtype: str = "auto"):
    """Load ``EaModel.from_pretrained(base_model, head, dtype=..., device_map=...)`` once."""
    from eagle.model.ea_model import EaModel

    dev, dt = resolve_device(device, dtype)
    return EaModel.from_pretrained(base_model_path=base_model, ea_model_path=head, dtype=dt, device_map=dev)


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


def _generate_once(model, input_ids, method: str, *, temperature: float, top_p: float, top_k: int,
                   max_new_tokens: int, tree: Optional[str], seed: int):
    """One engine call; returns ``(generated ids list, stats dict, seconds)``."""
    kw = dict(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens, seed=seed,
              return_stats=True)
    device = getattr(model, "device", "cpu")
    _sync(device)
    t0 = time.perf_counter()
    if method == BASELINE:
        out_ids, stats = model.naivegenerate(input_ids, **kw)
    else:
        out_ids, stats = model.eagenerate(input_ids, tree_choices=tree, verifier=method, **kw)
    _sync(device)
    seconds = time.perf_counter() - t0
    new_ids = out_ids[0, input_ids.shape[1]:].tolist()
    return new_ids, dict(stats or {}), seconds


def generate_turns(model, tokenizer, question: dict, method: str, *, temperature: float = 1.0,
                   top_p: float = 1.0, top_k: int = 0, max_new_tokens: int = 128,
                   tree: Optional[str] = "2x5", seed: int = 0,
                   prompt_builder: Optional[Callable[[object, list], list]] = None) -> dict:
    """Answer every turn of ``question``; returns the Spec-Bench ``choices[0]`` dict.

    Turn k's prompt = chat template of ``[user t1, assistant a1, ..., user tk]`` with the model's own
    answers (:func:`evaluation.questions.build_messages`). ``prompt_builder(tokenizer, messages) ->
    list[int]`` overrides the chat template (tests, tokenizer-free models).
    """
    import torch

    build = prompt_builder or build_prompt_ids
    device = getattr(model, "device", "cpu")
    choice = {"index": 0, "turns": [], "decoding_steps": [], "new_tokens": [], "wall_time": [],
              "accept_lengths": []}
    for k in range(len(question["turns"])):
        messages = build_messages(question["turns"][: k + 1], choice["turns"])
        ids = build(tokenizer, messages)
        input_ids = torch.tensor([ids], dtype=torch.long, device=device)  # [1, L]
        new_ids, stats, seconds = _generate_once(
            model, input_ids, method, temperature=temperature, top_p=top_p, top_k=top_k,
            max_new_tokens=max_new_tokens, tree=tree, seed=call_seed(seed, question["question_id"], k))
        n_new = int(stats.get("new_tokens", len(new_ids)))
        accept = [int(a) for a in stats.get("accept_lengths", [1] * n_new)]
        steps = int(stats.get("decoding_steps", len(accept)))
        text = tokenizer.decode(new_ids, skip_special_tokens=True).strip()
        choice["turns"].append(text)
        choice["decoding_steps"].append(steps)
        choice["new_tokens"].append(n_new)
        choice["wall_time"].append(float(seconds))
        choice["accept_lengths"].append(accept)
    return choice


def generate_answers(model, questions: Sequence[dict], answer_file: os.PathLike | str, method: str, *,
                     temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, tree: Optional[str] = "2x5",
                     seed: int = 0, max_new_tokens: int = 128, model_name: str = "default",
                     head: Optional[str] = None, tokenizer=None, warmup: bool = True, progress: bool = True,
                     prompt_builder: Optional[Callable] = None) -> int:
    """Append answers of ``method`` for the questions not yet in ``answer_file``.

    Args:
        model: an ``EaModel`` (or any object with ``eagenerate``/``naivegenerate``/``device``).
        questions: selected questions (:func:`evaluation.questions.select_questions`).
        answer_file: JSONL output (created with its folder; existing ids are skipped).
        method: ``"naive"`` or a verifier name.
        temperature, top_p, top_k: sampling processing (0 temperature = greedy).
        tree: tree spec passed to the engine (``"2x5"``, ``"mc_sim_7b_63"``, ...); ignored for naive.
        seed: run seed (see :func:`call_seed`).
        max_new_tokens: cap per turn (tokens).
        model_name, head: written as metadata.
        tokenizer: defaults to ``model.tokenizer``.
        warmup: run one short untimed generation first (only if something is to be generated).

    Returns:
        Number of questions written by this call.
    """
    from tqdm import tqdm

    tok = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tok is None:
        raise ValueError("no tokenizer: pass tokenizer= or use a model with .tokenizer")
    tree_used = None if method == BASELINE else tree
    path = Path(answer_file)
    done = read_answered_ids(path)
    todo = [q for q in questions if int(q["question_id"]) not in done]
    if not todo:
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    gen_kw = dict(temperature=temperature, top_p=top_p, top_k=top_k, tree=tree_used,
                  prompt_builder=prompt_builder)
    if warmup:
        warm_q = {"question_id": -1, "turns": todo[0]["turns"][:1]}
        generate_turns(model, tok, warm_q, method, max_new_tokens=min(16, max_new_tokens), seed=seed, **gen_kw)
    device = getattr(model, "device", "cpu")
    dtype = getattr(model, "dtype", None) or getattr(getattr(model, "base_model", None), "dtype", None)
    model_id = f"{Path(str(model_name)).name}-{method}-temp{_fmt_temp(temperature)}" + (
        f"-{tree_used}" if tree_used else "")
    written = 0
    label = f"{method} T={_fmt_temp(temperature)}" + (f" {tree_used}" if tree_used else "") + f" seed={seed}"
    with open(path, "a", encoding="utf-8") as f:
        for q in tqdm(todo, desc=label, disable=not progress, unit="q"):
            choice = generate_turns(model, tok, q, method, max_new_tokens=max_new_tokens, seed=seed, **gen_kw)
            rec = {
                "question_id": q["question_id"], "category": q["category"], "answer_id": uuid.uuid4().hex,
                "model_id": model_id, "choices": [choice], "tstamp": time.time(),
                "model": str(model_name), "head": None if head is None else str(head), "method": method,
                "seed": int(seed), "temperature": float(temperature), "top_p": float(top_p), "top_k": int(top_k),
                "tree": tree_used, "max_new_tokens": int(max_new_tokens), "device": str(device),
                "dtype": None if dtype is None else str(dtype),
            }
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            f.flush()
            written += 1
    return written


def run(model, questions: Sequence[dict], out_dir: os.PathLike | str, methods: Iterable[str],
        seeds: Iterable[int], *, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
        tree: str = "2x5", max_new_tokens: int = 128, model_name: str = "default", head: Optional[str] = None,
        tokenizer=None, progress: bool = True, prompt_builder: Optional[Callable] = None) -> list[Path]:
    """Every (method, seed) pair with one loaded model; returns the answer files (see
    :func:`answer_file_name`), which live in ``out_dir``."""
    files = []
    for seed in seeds:
        for method in methods:
            p = Path(out_dir) / answer_file_name(method, temperature, tree, seed)
            generate_answers(model, questions, p, method, temperature=temperature, top_p=top_p, top_k=top_k,
                             tree=tree, seed=seed, max_new_tokens=max_new_tokens, model_name=model_name,
                             head=head, tokenizer=tokenizer, progress=progress, prompt_builder=prompt_builder)
            files.append(p)
    return files


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Generate Spec-Bench answers (baseline 'naive' and verifiers).")
    ap.add_argument("--model", default="default", help="base model: 'default' (embedded SmolLM2), hub id or folder")
    ap.add_argument("--head", default=None, help="EAGLE head folder (default: the engine's default head)")
    ap.add_argument("--methods", nargs="+", default=[BASELINE, *DEFAULT_METHODS],
                    help="'naive' and/or verifier names (rrsw traversal greedy univer)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--tree", default="2x5", help="mc_sim_7b_63, KxD (e.g. 2x5, 3x3) or chainD")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="per turn (tokens)")
    ap.add_argument("--question-file", default=None)
    ap.add_argument("--categories", nargs="+", default=None, help="groups (mt_bench translation ...); default all")
    ap.add_argument("--per-category", type=int, default=None, help="N questions per group (mt_bench: N in total)")
    ap.add_argument("--out", default="runs/specbench", help="folder of the answer files")
    ap.add_argument("--answer-file", default=None, help="explicit output file (only with one method and one seed)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--dtype", default="auto", help="auto (cuda: float16, cpu: float32) | float16 | bfloat16 | float32")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU: torch intra-op threads (0 = torch's default). On a shared/oversubscribed CPU, 1 "
                         "is far faster (measured 20x on a 63-node tree forward with 2 cores under load 6)")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def main(argv: Optional[Sequence[str]] = None) -> list[Path]:
    args = _parser().parse_args(argv)
    if args.answer_file and (len(args.methods) != 1 or len(args.seeds) != 1):
        raise SystemExit("--answer-file needs exactly one method and one seed")
    questions = select_questions(load_questions(resolve_question_file(args.question_file)),
                                 args.categories, args.per_category)
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    model = load_model(args.model, args.head, args.device, args.dtype)
    if args.answer_file:
        generate_answers(model, questions, args.answer_file, args.methods[0], temperature=args.temperature,
                         top_p=args.top_p, top_k=args.top_k, tree=args.tree, seed=args.seeds[0],
                         max_new_tokens=args.max_new_tokens, model_name=args.model, head=args.head,
                         progress=not args.no_progress)
        return [Path(args.answer_file)]
    return run(model, questions, args.out, args.methods, args.seeds, temperature=args.temperature,
               top_p=args.top_p, top_k=args.top_k, tree=args.tree, max_new_tokens=args.max_new_tokens,
               model_name=args.model, head=args.head, progress=not args.no_progress)


if __name__ == "__main__":
    main()
