"""The paper in one command: a sweep of paper cells from one config file per setting, resumable and sharded.

A **setting** (``configs/paper/<name>.json``) fixes the model, its head or any registered drafter with its options
(``drafter``, ``drafter_options``; e.g. ``draft_lm`` with ``JackFram/llama-68m``), the questions, seeds,
methods and the paper's tables to reproduce (:data:`CONFIG_KEYS`). Its **cells** are the tables' (temperature,
tree) pairs; the numbers of a cell come from **exact expected tau on shared contexts**
(:mod:`evaluation.exact_tau`): contexts are positions in the plain-decoding answers at that temperature, every
method sees the same contexts, and the methods of one drafting rule see the same drafted trees. Errors are a
bootstrap over questions (stratified by category group), paired across methods for the Δ vs RRSw column.
A sampled-tau check (the engine's own runs, ``sampled_check``) runs where cheap.

**Units of work** (:func:`plan_units`): one ``exact`` unit per (seed, temperature, question): the plain-decoding
reference of that question, then every tree of every table at that temperature scored on its contexts; one
``sampled`` unit per (seed, question) of the sampled check. A unit's file
(``OUT/<setting>/units/<unit id>.json``) is rewritten after each tree it finishes (atomically) and holds the
reference's token ids, so a rerun skips what is done and a config that adds trees only scores the new ones.
A unit file also records what its numbers depend on (:func:`_unit_settings`: model, head, seed, ...; the drafter
and its options only for settings that name another drafter than ``eagle`` or give options, so the files of the
EAGLE-head settings are unchanged); a stored unit made with other values is refused, never reused.
A unit's numbers depend only on the unit (its seeds come from seed, question and context), so any split of the
units gives the same report.

**Sharding**: ``--shard i/n`` runs units ``i, i+n, i+2n, ...`` of the plan; without ``--shard`` the shard is
read from ``RANK``/``WORLD_SIZE`` (``accelerate launch``, ``torchrun``) or ``SLURM_PROCID``/``SLURM_NTASKS``, and
each process takes the GPU ``LOCAL_RANK``. Shards may share one output folder (unit files never collide) or
write their own; ``--merge [DIR ...]`` copies the units of the other folders into ``--out`` and writes the report.

**Report** (``OUT/<setting>/report.md`` + ``report.json`` + PNGs): for every paper cell the paper's value
(:mod:`evaluation.paper`; "-" where the paper has no number on record) beside ours, with a verdict: *same sign,
significant* (|Δ| > 2 SE and the paper's sign), *within noise* (|Δ| <= 2 SE), *opposite sign, significant*;
for the last, the measured reason from exact tau's branch-entry table (where each method's accepted path
enters the tree).

Command lines::

    python -m evaluation.reproduce configs/paper/default-cpu.json --quick          # one process; the script runs two
    python -m evaluation.reproduce configs/paper/default-cpu.json --dry-run        # cells + cost, offline
    python -m evaluation.reproduce configs/paper/default-cpu.json --shard 0/2 &    # two processes, one folder
    python -m evaluation.reproduce configs/paper/default-cpu.json --shard 1/2; wait
    python -m evaluation.reproduce configs/paper/default-cpu.json --merge          # the report
    accelerate launch --num_processes 8 -m evaluation.reproduce configs/paper/vicuna-7b.json   # one per GPU
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from evaluation.questions import SELECTION_PER_CATEGORY, question_sets

__all__ = ["CONFIG_KEYS", "ConfigError", "Setting", "Block", "load_setting", "plan_units",
           "detect_shard", "parse_shard", "estimate_cost", "dry_run_text", "run_units", "merge_units",
           "collect_cells", "build_report", "render_report", "main"]

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "configs" / "paper" / "default-cpu.json"
#: Spec-Bench's question file beside the checkout (used when data/spec_bench/question.jsonl is absent)
SHARED_QUESTION_FILE = REPO.parent / "shared" / "specbench" / "question.jsonl"
SIGNIFICANT_Z = 2.0

#: every key a setting may hold, with its meaning (an unknown key is an error naming it)
CONFIG_KEYS = {
    "name": "setting name; the output subfolder (required)",
    "description": "free text shown in the report",
    "model": "'default' (embedded CPU model) or a hub id / folder (required)",
    "head": "EAGLE-1 head hub id / folder; null = the shipped head of --model default",
    "drafter": "a registered drafter (default eagle, the EAGLE-1 head; draft_lm: a separate small LM; eagle3; hybrid; "
               "prompt_lookup; plug-ins')",
    "drafter_options": "{name: value} for the drafter's for_model (draft_lm: model_path_or_module, dtype; eagle3: path; "
                       "hybrid: lookup_weight, max_ngram, min_ngram, depth)",
    "draft_model": "shorthand for drafter 'draft_lm''s drafter_options.model_path_or_module (hub id or folder)",
    "paper_model": "whose published numbers sit beside ours (a key of evaluation.paper.PAPER_MODELS) or null",
    "device": "auto | cpu | cuda | cuda:N (a sharded GPU run takes cuda:LOCAL_RANK)",
    "dtype": "auto | float16 | bfloat16 | float32",
    "template": "prompt format (FastChat template name) or null for the default",
    "draft_vocab": "auto | off (draft over the head's draft vocabulary or the full vocabulary)",
    "threads": "CPU torch threads per process (default 1)",
    "questions": "{file, set: selection|report|all, per_category, selection_per_category}",
    "seeds": "list of seeds (reference generation and tree draws)",
    "methods": "verifiers (the first of them or 'reference' is the Δ reference)",
    "reference": "method the Δ column is relative to (default rrsw)",
    "max_new_tokens": "new tokens per turn of the plain-decoding reference",
    "contexts_per_question": "shared contexts per question (exact tau)",
    "draws": "tree draws per drafting rule and context",
    "bootstrap": "bootstrap resamples over questions",
    "tables": "list of paper tables: {table, layout: groups|grid|depth_width, temperatures, trees | widths+depths, "
              "max_nodes, per_category, contexts_per_question}",
    "sampled_check": "null or {temperature, tree, methods, per_category, max_new_tokens}",
    "cost": "{decode_step_s, prefill_tokens_per_step, context_tokens, device_label}: the dry run's cost model",
    "quick": "overrides for --quick (same keys; tables by their 'table' label)",
    "notes": "free text shown in the report",
}
QUESTION_KEYS = {"file", "set", "per_category", "selection_per_category"}
BLOCK_KEYS = {"table", "layout", "temperatures", "trees", "widths", "depths", "max_nodes", "per_category",
              "contexts_per_question"}
SAMPLED_KEYS = {"temperature", "tree", "methods", "per_category", "max_new_tokens"}
COST_KEYS = {"decode_step_s", "prefill_tokens_per_step", "context_tokens", "device_label"}
LAYOUTS = ("groups", "grid", "depth_width")


class ConfigError(ValueError):
    """A bad setting file; ``str()`` is one line naming the file and the key."""


@dataclass
class Block:
    """One paper table: its (temperature, tree) cells and which questions/contexts it uses."""

    table: str
    layout: str
    temperatures: list
    trees: list                       # tree names (depth_width: KxD, K outer, D inner)
    skipped: dict = field(default_factory=dict)   # tree -> why it is not run (max_nodes)
    per_category: Optional[int] = None
    contexts_per_question: Optional[int] = None
    widths: list = field(default_factory=list)
    depths: list = field(default_factory=list)


@dataclass
class Setting:
    """A checked setting (see :data:`CONFIG_KEYS`)."""

    path: str
    name: str
    raw: dict
    model: str
    head: Optional[str]
    drafter: str
    draft_model: Optional[str]
    paper_model: Optional[str]
    device: str
    dtype: str
    template: Optional[str]
    draft_vocab: str
    threads: int
    question_file: Optional[str]
    question_set: str
    per_category: Optional[int]
    selection_per_category: int
    seeds: list
    methods: list
    reference: str
    max_new_tokens: int
    contexts_per_question: int
    draws: int
    bootstrap: int
    blocks: list
    sampled: Optional[dict]
    cost: dict
    quick: bool
    description: str = ""
    notes: str = ""
    drafter_options: dict = field(default_factory=dict)

    def drafter_text(self) -> str:
        """``"eagle"``, or the drafter with its options, e.g. ``"draft_lm (model_path_or_module=JackFram/llama-68m)"``."""
        if not self.drafter_options:
            return self.drafter
        return f"{self.drafter} (" + ", ".join(f"{k}={v}" for k, v in self.drafter_options.items()) + ")"

    def temperatures(self) -> list[float]:
        return sorted({t for b in self.blocks for t in b.temperatures})


# ----------------------------------------------------------------------------------------------- config
def _err(path, key: str, msg: str) -> ConfigError:
    return ConfigError(f"{path}: {key}: {msg}")


def _int(path, key, v, minimum=1, allow_none=False):
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise _err(path, key, f"must be an integer >= {minimum}{' or null' if allow_none else ''}, got {v!r}")
    return v


def _float_list(path, key, v):
    if not isinstance(v, list) or not v or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                   and math.isfinite(x) and x >= 0 for x in v):
        raise _err(path, key, f"must be a non-empty list of temperatures >= 0, got {v!r}")
    return [float(x) for x in v]


def _str(path, key, v, allow_none=True):
    if v is None and allow_none:
        return None
    if not isinstance(v, str) or not v:
        raise _err(path, key, f"must be a non-empty string{' or null' if allow_none else ''}, got {v!r}")
    return v


def _unknown(path, where: str, d: dict, known) -> None:
    if not isinstance(d, dict):
        raise _err(path, where, f"must be an object, got {type(d).__name__}")
    bad = [k for k in d if k not in known]
    if bad:
        raise _err(path, f"{where}.{bad[0]}" if where else bad[0], f"unknown key (known: {', '.join(sorted(known))})")


def tree_nodes(tree: str) -> int:
    """Nodes of a tree, root included (KxD: the full K-ary tree of depth D)."""
    import re

    m = re.fullmatch(r"(\d+)x(\d+)", tree)
    if m:
        k, d = int(m.group(1)), int(m.group(2))
        return sum(k ** i for i in range(d + 1))
    from eagle.tree import build_tree

    return int(len(build_tree(tree).parents))


def tree_levels(tree: str) -> int:
    import re

    m = re.fullmatch(r"(\d+)x(\d+)", tree)
    if m:
        return int(m.group(2))
    from eagle.tree import build_tree

    return int(max(build_tree(tree).depth))


def _check_tree(path, key, tree) -> str:
    if not isinstance(tree, str):
        raise _err(path, key, f"a tree is a name (2x5, 3x3, mc_sim_7b_63, chain4), got {tree!r}")
    try:
        from eagle.tree import build_tree

        build_tree(tree)
    except (ValueError, TypeError, KeyError) as e:
        raise _err(path, key, f"unknown tree {tree!r} ({e})") from None
    return tree


def _merge(base: dict, over: dict, path) -> dict:
    """Deep-merge ``over`` into a copy of ``base``; ``tables`` overrides are keyed by the block's ``table``."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if k == "tables" and isinstance(v, dict):
            labels = [b.get("table") for b in out.get("tables", [])]
            for label, sub in v.items():
                if label not in labels:
                    raise _err(path, f"quick.tables.{label}", f"no table with that label (tables: {labels})")
                i = labels.index(label)
                out["tables"][i] = {**out["tables"][i], **sub} if sub is not None else None
            out["tables"] = [b for b in out["tables"] if b is not None]
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


def load_setting(path, quick: bool = False, check_methods: bool = True) -> Setting:
    """Read and check a setting file (``--quick`` applies its ``quick`` overrides).

    Raises:
        ConfigError: one line ``"<file>: <key>: <problem>"`` for the first bad key.
    """
    path = str(path)
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    _unknown(path, "", raw, CONFIG_KEYS)
    if quick and raw.get("quick"):
        q = raw["quick"]
        _unknown(path, "quick", q, set(CONFIG_KEYS) - {"quick", "name"})
        raw_eff = _merge({k: v for k, v in raw.items() if k != "quick"}, q, path)
    else:
        raw_eff = {k: v for k, v in raw.items() if k != "quick"}
    c = raw_eff
    for req in ("name", "model"):
        if req not in c:
            raise _err(path, req, "missing (required)")
    name = _str(path, "name", c["name"], allow_none=False)
    if not all(ch.isalnum() or ch in "-_." for ch in name):
        raise _err(path, "name", f"letters, digits, '-', '_', '.' only (it names a folder), got {name!r}")
    drafter, drafter_options = _check_drafter(path, c)
    from evaluation.paper import PAPER_MODELS

    paper_model = c.get("paper_model")
    if paper_model is not None and paper_model not in PAPER_MODELS:
        raise _err(path, "paper_model", f"unknown {paper_model!r} (known: {', '.join(PAPER_MODELS)})")
    qs = c.get("questions", {})
    _unknown(path, "questions", qs, QUESTION_KEYS)
    qset = qs.get("set", "report")
    if qset not in ("selection", "report", "all"):
        raise _err(path, "questions.set", f"use selection, report or all, got {qset!r}")
    seeds = c.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or len(set(map(str, seeds))) != len(seeds):
        raise _err(path, "seeds", f"must be a non-empty list of distinct integers, got {seeds!r}")
    seeds = [_int(path, "seeds", s, minimum=0) for s in seeds]
    methods = c.get("methods", ["rrsw", "traversal", "greedy", "univer"])
    if not isinstance(methods, list) or not methods or not all(isinstance(m, str) for m in methods):
        raise _err(path, "methods", f"must be a non-empty list of verifier names, got {methods!r}")
    reference = c.get("reference", "rrsw")
    if reference not in methods:
        raise _err(path, "reference", f"{reference!r} is not among the methods {methods}")
    if check_methods:
        from evaluation.arguments import load_plugins, method_names

        load_plugins([])
        known = method_names(1.0)
        bad = [m for m in methods if m not in known]
        if bad:
            raise _err(path, "methods", f"unknown verifier(s) {bad} (known: {known})")
    blocks = []
    tables = c.get("tables")
    if not isinstance(tables, list) or not tables:
        raise _err(path, "tables", "must be a non-empty list of table blocks")
    for i, b in enumerate(tables):
        where = f"tables[{i}]"
        _unknown(path, where, b, BLOCK_KEYS)
        label = _str(path, f"{where}.table", b.get("table"), allow_none=False)
        layout = b.get("layout", "grid")
        if layout not in LAYOUTS:
            raise _err(path, f"{where}.layout", f"use one of {LAYOUTS}, got {layout!r}")
        temps = _float_list(path, f"{where}.temperatures", b.get("temperatures"))
        if any(t == 0 for t in temps):
            raise _err(path, f"{where}.temperatures", "temperature 0: all methods coincide (nothing to compare)")
        widths, depths = [], []
        if layout == "depth_width":
            for key in ("widths", "depths"):
                v = b.get(key)
                if not isinstance(v, list) or not v:
                    raise _err(path, f"{where}.{key}", f"must be a non-empty list of integers >= 1, got {v!r}")
                [_int(path, f"{where}.{key}", x) for x in v]
            widths, depths = list(b["widths"]), list(b["depths"])
            if "trees" in b:
                raise _err(path, f"{where}.trees", "a depth_width block takes widths and depths, not trees")
            trees = [f"{k}x{d}" for k in widths for d in depths]
        else:
            trees = b.get("trees")
            if not isinstance(trees, list) or not trees:
                raise _err(path, f"{where}.trees", f"must be a non-empty list of tree names, got {trees!r}")
            trees = [_check_tree(path, f"{where}.trees", t) for t in trees]
            if layout == "groups" and (len(trees) != 1 or len(temps) != 1):
                raise _err(path, f"{where}.layout", "a 'groups' table has one temperature and one tree")
        max_nodes = _int(path, f"{where}.max_nodes", b.get("max_nodes"), allow_none=True)
        skipped = {}
        if max_nodes is not None:
            for t in trees:
                n = tree_nodes(t) - 1
                if n > max_nodes:
                    skipped[t] = f"{n} draft nodes > max_nodes {max_nodes}"
        blocks.append(Block(table=label, layout=layout, temperatures=temps, trees=trees, skipped=skipped,
                            per_category=_int(path, f"{where}.per_category", b.get("per_category"), allow_none=True),
                            contexts_per_question=_int(path, f"{where}.contexts_per_question",
                                                       b.get("contexts_per_question"), allow_none=True),
                            widths=widths, depths=depths))
    if len({b.table for b in blocks}) != len(blocks):
        raise _err(path, "tables", "two blocks have the same 'table' label")
    sampled = c.get("sampled_check")
    if sampled is not None:
        _unknown(path, "sampled_check", sampled, SAMPLED_KEYS)
        t = sampled.get("temperature", 1.0)
        _float_list(path, "sampled_check.temperature", [t])
        sm = sampled.get("methods", methods)
        if not isinstance(sm, list) or not sm or any(m not in methods for m in sm):
            raise _err(path, "sampled_check.methods", f"must be a non-empty subset of the methods {methods}, got {sm!r}")
        sampled = {"temperature": float(t), "tree": _check_tree(path, "sampled_check.tree", sampled.get("tree", "2x5")),
                   "methods": sm,
                   "per_category": _int(path, "sampled_check.per_category", sampled.get("per_category"), allow_none=True),
                   "max_new_tokens": _int(path, "sampled_check.max_new_tokens", sampled.get("max_new_tokens", 64))}
    cost = c.get("cost", {})
    _unknown(path, "cost", cost, COST_KEYS)
    cost = {"decode_step_s": 0.093, "prefill_tokens_per_step": 40, "context_tokens": 300,
            "device_label": "1 CPU thread", **cost}
    for k in ("decode_step_s", "prefill_tokens_per_step", "context_tokens"):
        if not isinstance(cost[k], (int, float)) or isinstance(cost[k], bool) or cost[k] <= 0:
            raise _err(path, f"cost.{k}", f"must be a positive number, got {cost[k]!r}")
    for k in ("description", "notes", "template", "head"):
        _str(path, k, c.get(k))
    from eagle.drafters import get_drafter

    if c.get("model") != "default" and get_drafter(drafter).needs_head and not c.get("head"):
        raise _err(path, "head", f"required for model {c.get('model')!r} with drafter {drafter!r} (an EAGLE-1 head "
                                 f"hub id or folder)")
    if check_methods:
        from evaluation.arguments import UsageError, check_drafter

        try:
            check_drafter(drafter, methods, 1.0)
        except UsageError as e:
            raise _err(path, "drafter", str(e).split(": ", 1)[1]) from None
    dv = c.get("draft_vocab", "auto")
    if dv not in ("auto", "off"):
        raise _err(path, "draft_vocab", f"use auto or off, got {dv!r}")
    return Setting(path=path, name=name, raw=raw_eff, model=_str(path, "model", c["model"], allow_none=False),
                   head=c.get("head"), drafter=drafter, draft_model=c.get("draft_model"), paper_model=paper_model,
                   device=_str(path, "device", c.get("device", "auto")), dtype=_str(path, "dtype", c.get("dtype", "auto")),
                   template=c.get("template"), draft_vocab=dv, threads=_int(path, "threads", c.get("threads", 1), 0),
                   question_file=_str(path, "questions.file", qs.get("file")), question_set=qset,
                   per_category=_int(path, "questions.per_category", qs.get("per_category"), allow_none=True),
                   selection_per_category=_int(path, "questions.selection_per_category",
                                               qs.get("selection_per_category", SELECTION_PER_CATEGORY)),
                   seeds=seeds, methods=methods, reference=reference,
                   max_new_tokens=_int(path, "max_new_tokens", c.get("max_new_tokens", 128)),
                   contexts_per_question=_int(path, "contexts_per_question", c.get("contexts_per_question", 6)),
                   draws=_int(path, "draws", c.get("draws", 1)), bootstrap=_int(path, "bootstrap", c.get("bootstrap", 1000), 2),
                   blocks=blocks, sampled=sampled, cost=cost, quick=quick,
                   description=c.get("description") or "", notes=c.get("notes") or "", drafter_options=drafter_options)


def _check_drafter(path, c: dict) -> tuple[str, dict]:
    """``(drafter, drafter_options)`` of a raw setting: a registered drafter, its options checked by the drafter
    (:func:`evaluation.arguments.check_option_dict`, nothing loaded); ``draft_model`` is drafter ``draft_lm``'s
    ``model_path_or_module``.

    Raises:
        ConfigError: ``drafter``, ``drafter_options`` or ``draft_model`` (one line naming the key).
    """
    from eagle.drafters import available_drafters, get_drafter
    from evaluation.arguments import check_option_dict

    drafter = c.get("drafter", "eagle")
    if not isinstance(drafter, str) or not drafter.strip():
        raise _err(path, "drafter", f"must be a drafter name, got {drafter!r}")
    drafter = drafter.strip().lower()
    try:
        get_drafter(drafter)
    except ValueError:
        raise _err(path, "drafter", f"unknown drafter {drafter!r}; use one of {available_drafters()}") from None
    opts = c.get("drafter_options") or {}
    if not isinstance(opts, dict):
        raise _err(path, "drafter_options", f"must be an object of name: value, got {opts!r}")
    opts = dict(opts)
    dm = _str(path, "draft_model", c.get("draft_model"))
    if dm is not None:
        if drafter != "draft_lm":
            raise _err(path, "draft_model", f"only with drafter 'draft_lm' (this setting's drafter is {drafter!r}); "
                                            f"use drafter_options")
        if opts.get("model_path_or_module", dm) != dm:
            raise _err(path, "draft_model", f"{dm!r} and drafter_options.model_path_or_module "
                                            f"{opts['model_path_or_module']!r} disagree: give one")
        opts = {"model_path_or_module": dm, **opts}
    try:
        opts = check_option_dict(drafter, opts)
    except ValueError as e:
        key = "draft_model" if dm is not None and not c.get("drafter_options") else "drafter_options"
        raise _err(path, key, " ".join(str(e).split())) from None
    return drafter, opts


# -------------------------------------------------------------------------------------------- questions
def pick_questions(s: Setting, download: bool = True) -> list[dict]:
    """The setting's questions (its set, then ``per_category`` per group)."""
    from evaluation.questions import (DEFAULT_QUESTION_FILE, QuestionFileError, load_questions,
                                      resolve_question_file, select_questions)

    path = s.question_file
    if path is None and not DEFAULT_QUESTION_FILE.is_file() and SHARED_QUESTION_FILE.is_file():
        path = SHARED_QUESTION_FILE  # a checkout beside shared/ (this project's machines)
    try:
        qs = load_questions(resolve_question_file(path, download=download))
    except (FileNotFoundError, QuestionFileError, ValueError) as e:
        raise ConfigError(f"{s.path}: questions.file: {' '.join(str(e).split())}") from None
    pool = question_sets(qs, s.selection_per_category)[s.question_set]
    if not pool:
        raise ConfigError(f"{s.path}: questions.set: the {s.question_set!r} set is empty for this question file")
    return select_questions(pool, None, s.per_category)


def block_questions(b: Block, questions: Sequence[dict]) -> set[int]:
    from evaluation.questions import select_questions

    qs = questions if b.per_category is None else select_questions(questions, None, b.per_category)
    return {int(q["question_id"]) for q in qs}


# ------------------------------------------------------------------------------------------------ units
def _tkey(t: float) -> str:
    return f"{t:g}"


def job_key(tree: str, cpq: int) -> str:
    return f"{tree}@{cpq}"


def plan_units(s: Setting, questions: Sequence[dict]) -> list[dict]:
    """Every unit of work in a fixed order (seed, temperature, question; then the sampled check)."""
    units = []
    block_q = {b.table: block_questions(b, questions) for b in s.blocks}
    for seed in s.seeds:
        for t in s.temperatures():
            for q in questions:
                qid = int(q["question_id"])
                jobs = []
                for b in s.blocks:
                    if t not in b.temperatures or qid not in block_q[b.table]:
                        continue
                    cpq = b.contexts_per_question or s.contexts_per_question
                    for tree in b.trees:
                        if tree not in b.skipped and job_key(tree, cpq) not in jobs:
                            jobs.append(job_key(tree, cpq))
                if jobs:
                    units.append({"id": f"exact-s{seed}-t{_tkey(t)}-q{qid}", "kind": "exact", "seed": seed,
                                  "temperature": t, "question_id": qid, "jobs": jobs})
    if s.sampled:
        from evaluation.questions import select_questions

        sq = questions if s.sampled["per_category"] is None else select_questions(questions, None,
                                                                                   s.sampled["per_category"])
        for seed in s.seeds:
            for q in sq:
                units.append({"id": f"sampled-s{seed}-t{_tkey(s.sampled['temperature'])}-{s.sampled['tree']}-"
                                    f"q{int(q['question_id'])}", "kind": "sampled", "seed": seed,
                              "temperature": s.sampled["temperature"], "question_id": int(q["question_id"]),
                              "tree": s.sampled["tree"], "methods": list(s.sampled["methods"])})
    return units


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` -> ``(i, n)`` with ``0 <= i < n``."""
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise ConfigError(f"--shard: use i/n (e.g. 0/2), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise ConfigError(f"--shard: need 0 <= i < n, got {text!r}")
    return i, n


def detect_shard(env=os.environ) -> tuple[int, int, Optional[int]]:
    """``(rank, world, local_rank)`` from a launcher's environment (``accelerate``/``torchrun``: RANK,
    WORLD_SIZE, LOCAL_RANK; Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID); ``(0, 1, None)`` alone."""
    for r, w, lr in (("RANK", "WORLD_SIZE", "LOCAL_RANK"), ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")):
        if env.get(w) and int(env[w]) > 1:
            rank = int(env.get(r, env.get(lr, 0)))
            return rank, int(env[w]), int(env[lr]) if env.get(lr) else None
    return 0, 1, None


def _unit_settings(s: Setting, u: dict) -> dict:
    """What a unit's numbers depend on besides its jobs (a stored unit with other values is not reused).

    The drafter and its options are added only for a setting that names another drafter than ``eagle``
    (``"drafter"``) or gives options (``"drafter"`` and ``"drafter_options"``): the settings of an EAGLE-head
    setting without options, hence its unit files, are exactly those written before drafters had options
    (``tests/test_reproduce_drafters.py`` pins them for ``configs/paper/default-cpu.json``).
    """
    d = {"model": s.model, "head": s.head, "draft_vocab": s.draft_vocab, "template": s.template,
         "seed": u["seed"], "temperature": u["temperature"], "question_id": u["question_id"], "draws": s.draws}
    if u["kind"] == "exact":
        d.update(max_new_tokens=s.max_new_tokens, methods=list(s.methods))
    else:
        d.update(max_new_tokens=s.sampled["max_new_tokens"], tree=u["tree"])
    if s.drafter != "eagle" or s.drafter_options:
        d["drafter"] = s.drafter
    if s.drafter_options:
        d["drafter_options"] = dict(s.drafter_options)
    return d


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _read_unit(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        return None  # a torn file (cannot happen with the atomic write, but never trust it): redo the unit


def unit_done(s: Setting, u: dict, rec: Optional[dict]) -> bool:
    """True when ``rec`` (the stored unit) covers ``u``; raises ConfigError when it was made with other settings."""
    if rec is None:
        return False
    want = _unit_settings(s, u)
    if rec.get("settings") != want:
        diff = [k for k in want if rec.get("settings", {}).get(k) != want[k]]
        raise ConfigError(f"--out: unit {u['id']} there was computed with other settings ({', '.join(diff)}); "
                         f"use another --out or delete that unit file")
    if u["kind"] == "exact":
        return all(j in rec.get("scores", {}) for j in u["jobs"])
    return all(m in rec.get("methods", {}) for m in u["methods"])


# --------------------------------------------------------------------------------------------- running
def load_for_setting(s: Setting, device: Optional[str] = None):
    """``(model, prompt format)`` of a setting (the harness's loader and checks), drafting with the setting's drafter
    and options (the head is loaded only for a drafter that needs one, or when the setting names it).

    Raises:
        ConfigError: a bad device, model, head, template, or a load that failed (one line).
    """
    from evaluation.arguments import (UsageError, check_device, check_head, check_model, check_template,
                                      load_checked_model, Config)

    from eagle.drafters import get_drafter

    try:
        dev, dtype = check_device(device or s.device, s.dtype)
        model = check_model(s.model)
        head = check_head(s.head, model) if get_drafter(s.drafter).needs_head or s.head else None
        cfg = Config(model=model, head=head, temperature=1.0, top_p=1.0, top_k=0, tree="2x5",
                     methods=list(s.methods), seeds=list(s.seeds), per_category=None, max_new_tokens=s.max_new_tokens,
                     questions=[], question_file=None, out=Path("."), device=dev, dtype=dtype, threads=s.threads,
                     template=check_template(s.template, model), plugins=[], quick=s.quick, note=None,
                     contexts_per_question=s.contexts_per_question, draws=s.draws, bootstrap=s.bootstrap,
                     no_progress=True, plots=False, draft_vocab=s.draft_vocab, drafter=s.drafter,
                     drafter_options=dict(s.drafter_options))
        return load_checked_model(cfg)
    except UsageError as e:
        raise ConfigError(f"{s.path}: {' '.join(str(e).split())}") from None


def _run_exact_unit(s: Setting, u: dict, q: dict, model, fmt, rec: Optional[dict], path: Path,
                    log: Callable[[str], None]) -> dict:
    from evaluation import exact_tau as X
    from evaluation.gen_answer import generate_turns
    from evaluation.questions import category_group

    tok = model.tokenizer
    if rec is None:
        t0 = time.perf_counter()
        c = generate_turns(model, tok, q, "naive", temperature=u["temperature"], max_new_tokens=s.max_new_tokens,
                           tree=None, seed=u["seed"], prompt_builder=fmt.ids, expected_tau=False)
        rec = {"id": u["id"], "kind": "exact", "settings": _unit_settings(s, u), "group": category_group(q["category"]),
               "reference": {"turns": c["turns"], "new_token_ids": c["new_token_ids"], "new_tokens": c["new_tokens"]},
               "seconds": {"reference": time.perf_counter() - t0}, "scores": {}}
        _write_json(path, rec)
    ref = [{"question_id": u["question_id"], "category": q["category"], "choices": [rec["reference"]]}]
    left: dict[int, list[str]] = {}
    for job in u["jobs"]:
        if job not in rec["scores"]:
            tree, cpq = job.rsplit("@", 1)
            left.setdefault(int(cpq), []).append(tree)
    for cpq, trees in left.items():   # one target prefill per context for all of its trees
        t0 = time.perf_counter()
        ctxs = X.shared_contexts(ref, [q], lambda msgs: fmt.ids(tok, msgs), cpq)
        scored = X.score_contexts_trees(model, ctxs, s.methods, trees=trees, temperature=u["temperature"],
                                        draws=s.draws, seed=u["seed"])
        for tree in trees:
            rec["scores"][job_key(tree, cpq)] = scored[tree]
        rec["seconds"][f"trees@{cpq}"] = time.perf_counter() - t0
        _write_json(path, rec)
        log(f"  {u['id']}: {len(trees)} tree(s) x {len(ctxs)} context(s), {rec['seconds'][f'trees@{cpq}']:.1f} s")
    return rec


def _run_sampled_unit(s: Setting, u: dict, q: dict, model, fmt, rec: Optional[dict], path: Path,
                      log: Callable[[str], None]) -> dict:
    from evaluation.gen_answer import generate_turns
    from evaluation.questions import category_group

    if rec is None:
        rec = {"id": u["id"], "kind": "sampled", "settings": _unit_settings(s, u), "group": category_group(q["category"]),
               "methods": {}, "seconds": {}}
    for m in u["methods"]:
        if m in rec["methods"]:
            continue
        t0 = time.perf_counter()
        c = generate_turns(model, model.tokenizer, q, m, temperature=u["temperature"],
                           max_new_tokens=s.sampled["max_new_tokens"], tree=u["tree"], seed=u["seed"],
                           prompt_builder=fmt.ids)
        rec["methods"][m] = {"accept_lengths": c["accept_lengths"],
                             "expected_accept_lengths": c.get("expected_accept_lengths")}
        rec["seconds"][m] = time.perf_counter() - t0
        _write_json(path, rec)
        log(f"  {u['id']} {m}: {len(c['accept_lengths'])} cycles, {rec['seconds'][m]:.1f} s")
    return rec


def units_dir(out: Path, s: Setting) -> Path:
    return Path(out) / s.name / "units"


def run_units(s: Setting, questions: Sequence[dict], out: Path, shard: tuple[int, int] = (0, 1), *,
              model=None, fmt=None, loader: Optional[Callable] = None, device: Optional[str] = None,
              log: Callable[[str], None] = print) -> dict:
    """Run this shard's units that are not done yet; returns ``{"ran", "skipped", "seconds"}``.

    The model is loaded (``loader(setting, device)``, default :func:`load_for_setting`) only when a unit is left.
    """
    i, n = shard
    units = plan_units(s, questions)[i::n]
    by_id = {int(q["question_id"]): q for q in questions}
    udir = units_dir(out, s)
    todo = []
    for u in units:
        rec = _read_unit(udir / f"{u['id']}.json")
        if not unit_done(s, u, rec):
            todo.append((u, rec))
    log(f"== {s.name}: shard {i}/{n}: {len(units)} units, {len(units) - len(todo)} done already, {len(todo)} to run")
    t0 = time.perf_counter()
    if todo and model is None:
        model, fmt = (loader or load_for_setting)(s, device)
    for k, (u, rec) in enumerate(todo):
        path = udir / f"{u['id']}.json"
        log(f"[{k + 1}/{len(todo)}] {u['id']}")
        run = _run_exact_unit if u["kind"] == "exact" else _run_sampled_unit
        run(s, u, by_id[u["question_id"]], model, fmt, rec, path, log)
    return {"ran": len(todo), "skipped": len(units) - len(todo), "seconds": time.perf_counter() - t0}


def merge_units(s: Setting, out: Path, sources: Sequence[Path]) -> int:
    """Copy the unit files of ``sources`` (shard output folders) into ``out``; returns how many were copied.

    A unit present in both with other content: the one covering more jobs wins.
    """
    import shutil

    dest = units_dir(out, s)
    dest.mkdir(parents=True, exist_ok=True)
    copied = 0
    for src in sources:
        src = Path(src)
        sdir = src / s.name / "units" if (src / s.name / "units").is_dir() else src / "units"
        if not sdir.is_dir():
            raise ConfigError(f"--merge: {src} holds no units of setting {s.name!r} (looked in {sdir})")
        if sdir.resolve() == dest.resolve():
            continue
        for f in sorted(sdir.glob("*.json")):
            mine = _read_unit(dest / f.name)
            theirs = _read_unit(f)
            if theirs is None:
                continue
            size = lambda r: len(r.get("scores", r.get("methods", {})))  # noqa: E731
            if mine is None or size(theirs) > size(mine):
                shutil.copyfile(f, dest / f.name)
                copied += 1
    return copied


# --------------------------------------------------------------------------------------------- the cells
def _verdict(delta: Optional[dict], paper_delta: Optional[float], note: Optional[dict], delta_abs: Optional[dict]):
    """(verdict text, code) for one method in one cell."""
    if delta is None or delta.get("mean") is None:
        return "-", "none"
    d, se = delta["mean"], delta.get("se")
    if note is not None and paper_delta is None:
        lim = note["max_abs_delta"]
        a, ase = (delta_abs or {}).get("mean"), (delta_abs or {}).get("se")
        if a is None:
            return "-", "none"
        if ase is None:
            return (f"|Δτ| = {abs(a):.3f} {'≤' if abs(a) <= lim else '>'} {lim:g} (no SE: too few questions)"), "none"
        if abs(a) - SIGNIFICANT_Z * ase <= lim:
            return f"consistent with the paper's note (|Δτ| ≤ {lim:g} within 2 SE)", "note_ok"
        return f"differs from the paper's note: |Δτ| = {abs(a):.3f} > {lim:g} significantly", "note_differs"
    if se == 0 and d == 0:
        return "identical to the reference (same law on this tree)", "identical"
    if se is None or se == 0:
        return "no SE (too few questions)", "none"
    z = d / se
    if abs(z) <= SIGNIFICANT_Z:
        return "within noise", "noise"
    if paper_delta is None:
        return ("ours significant, paper has no number", "no_paper")
    if (d > 0) == (paper_delta > 0):
        return "same sign, significant", "same"
    return "opposite sign, significant", "opposite"


def _reason(row: dict, ref_row: dict) -> Optional[str]:
    """A measured reason for a method losing to (or beating) the reference, from the branch-entry tables."""
    b, r = row.get("branches"), ref_row.get("branches")
    if not b or not r or len(b["enter"]) != len(r["enter"]):
        return None
    dt = np.array(b["tokens"]) - np.array(r["tokens"])
    k = int(np.argmax(np.abs(dt)))
    from evaluation.tables import method_label

    m, ref = method_label(row["method"]), method_label(ref_row["method"])
    parts = [f"the largest difference is in the subtree of root child rank {k}: {m} enters it with "
             f"P={b['enter'][k]:.3f} vs {ref} {r['enter'][k]:.3f}, E[tokens through it] {b['tokens'][k]:.3f} vs "
             f"{r['tokens'][k]:.3f} ({dt[k]:+.3f})"]
    parts.append(f"P(no draft token accepted) {m} {b['no_draft_accepted']:.3f} vs {ref} {r['no_draft_accepted']:.3f}")
    rest = float(dt.sum() - dt[k])
    parts.append(f"all other ranks together {rest:+.3f} tokens")
    return "; ".join(parts)


def collect_cells(s: Setting, questions: Sequence[dict], out: Path) -> dict:
    """Read the units and summarise every cell (:func:`evaluation.exact_tau.summarize_exact`)."""
    from evaluation import exact_tau as X

    udir = units_dir(out, s)
    units = plan_units(s, questions)
    recs = {u["id"]: _read_unit(udir / f"{u['id']}.json") for u in units}
    missing = [u["id"] for u in units if not recs[u["id"]] or
               (u["kind"] == "exact" and not all(j in recs[u["id"]].get("scores", {}) for j in u["jobs"])) or
               (u["kind"] == "sampled" and not all(m in recs[u["id"]].get("methods", {}) for m in u["methods"]))]
    block_q = {b.table: block_questions(b, questions) for b in s.blocks}
    cells = []
    for b in s.blocks:
        cpq = b.contexts_per_question or s.contexts_per_question
        for t in b.temperatures:
            for tree in b.trees:
                cell = {"table": b.table, "layout": b.layout, "temperature": t, "tree": tree}
                if tree in b.skipped:
                    cell["skipped"] = b.skipped[tree]
                    cells.append(cell)
                    continue
                job = job_key(tree, cpq)
                scored, n_units, n_done = [], 0, 0
                for u in units:
                    if u["kind"] != "exact" or u["temperature"] != t or u["question_id"] not in block_q[b.table]:
                        continue
                    n_units += 1
                    rec = recs[u["id"]]
                    if rec and job in rec.get("scores", {}):
                        n_done += 1
                        scored.extend(rec["scores"][job])
                cell.update(units=n_units, units_done=n_done)
                if scored:
                    ex = X.summarize_exact(scored, s.methods, n_boot=s.bootstrap, seed=0, reference=s.reference,
                                           meta={"temperature": t, "tree": tree, "contexts_per_question": cpq,
                                                 "draws": s.draws, "context_source": "the plain-decoding answers"})
                    ex.pop("contexts")
                    cell["exact"] = ex
                cells.append(cell)
    sampled = None
    if s.sampled:
        per_q: dict[str, dict] = {m: {} for m in s.sampled["methods"]}
        rb: dict[str, dict] = {m: {} for m in s.sampled["methods"]}
        for u in units:
            rec = recs[u["id"]]
            if u["kind"] != "sampled" or not rec or not all(m in rec["methods"] for m in u["methods"]):
                continue
            for m in u["methods"]:
                al = rec["methods"][m]["accept_lengths"]
                per_q[m][u["question_id"]] = (rec["group"], float(sum(al)), len(al))
                ea = rec["methods"][m].get("expected_accept_lengths")
                if ea:
                    rb[m][u["question_id"]] = (rec["group"], float(sum(ea)), len(ea))
        if all(per_q[m] for m in per_q):
            ref = s.reference if s.reference in per_q else next(iter(per_q))
            sampled = {**s.sampled, "tau": X.paired_bootstrap(per_q, s.bootstrap, 0, ref),
                       "rb_tau": X.paired_bootstrap(rb, s.bootstrap, 0, ref) if all(rb[m] for m in rb) else None,
                       "n_questions": len(next(iter(per_q.values()))), "reference": ref}
    return {"cells": cells, "sampled": sampled, "missing_units": missing, "n_units": len(units)}


def build_report(s: Setting, questions: Sequence[dict], out: Path) -> dict:
    """``report.json``'s content: settings, every cell with the paper beside it, verdicts, reasons."""
    from evaluation.paper import PAPER_MODELS, paper_cell, paper_delta_pct, paper_note

    got = collect_cells(s, questions, out)
    verdicts = []
    for cell in got["cells"]:
        pc = paper_cell(s.paper_model, cell["temperature"], cell["tree"])
        note = paper_note(s.paper_model, cell["temperature"])
        cell["paper"] = pc
        cell["paper_note"] = note
        ex = cell.get("exact")
        rows = {r["method"]: r for r in ex["rows"]} if ex else {}
        for m in s.methods:
            row = rows.get(m)
            pd = paper_delta_pct(pc, m, s.reference)
            v = {"table": cell["table"], "layout": cell["layout"], "temperature": cell["temperature"],
                 "tree": cell["tree"], "method": m, "paper_tau": (pc or {}).get("tau", {}).get(m),
                 "paper_source": (pc or {}).get("source"), "paper_delta_pct": pd,
                 "paper_note": note["text"] if note and pd is None else None,
                 "tau": row["avg_tau"] if row else None, "delta_pct": row["delta_pct"] if row else None,
                 "skipped": cell.get("skipped")}
            if m == s.reference:
                v["verdict"], v["code"] = "reference", "reference"
            elif cell.get("skipped"):
                v["verdict"], v["code"] = f"not run ({cell['skipped']})", "skipped"
            else:
                da = (row or {}).get("delta_abs") or {}
                v["verdict"], v["code"] = _verdict(v["delta_pct"], pd, note, da.get("avg"))
                if v["code"] == "opposite" and rows.get(s.reference):
                    v["reason"] = _reason(row, rows[s.reference])
            verdicts.append(v)
    ids = [int(q["question_id"]) for q in questions]
    return {"setting": s.name, "config": s.path, "quick": s.quick, "model": s.model, "head": s.head,
            "drafter": s.drafter, "drafter_options": s.drafter_options, "paper_model": s.paper_model,
            "paper_label": PAPER_MODELS.get(s.paper_model or "", {}).get("label"),
            "question_set": s.question_set, "selection_per_category": s.selection_per_category,
            "question_ids": ids, "seeds": s.seeds, "methods": s.methods, "reference": s.reference,
            "max_new_tokens": s.max_new_tokens, "contexts_per_question": s.contexts_per_question, "draws": s.draws,
            "bootstrap": s.bootstrap, **got, "verdicts": verdicts, "description": s.description, "notes": s.notes}


# ---------------------------------------------------------------------------------------------- render
def _pm(ms: Optional[dict], digits: int, suffix: str = "", sign: bool = False) -> str:
    from evaluation.tables import _cell

    return _cell(ms, digits, suffix, sign)


def _num(x: Optional[float], digits: int, sign: bool = False, suffix: str = "") -> str:
    if x is None:
        return "-"
    return (f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}") + suffix


def _ids_text(ids: Sequence[int]) -> str:
    ids = sorted(ids)
    runs, start = [], None
    for k, x in enumerate(ids):
        if start is None:
            start = x
        if k + 1 == len(ids) or ids[k + 1] != x + 1:
            runs.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ", ".join(runs)


def render_report(rep: dict, pngs: Sequence[str] = ()) -> str:
    """Markdown of :func:`build_report` (verdict table first, then each table's layout)."""
    from evaluation import exact_tau as X
    from evaluation.tables import GROUP_LABELS, method_label

    L = []
    title = f"# Paper reproduction: {rep['setting']}"
    L += [title, ""]
    if rep["quick"]:
        L += ["**SMOKE RUN (--quick): few questions and contexts; it checks that every cell runs, its errors are "
              "wide and its verdicts are not a result.**", ""]
    if rep.get("description"):
        L += [rep["description"], ""]
    drafter = rep.get("drafter") or "eagle"
    if drafter == "eagle" and not rep.get("drafter_options"):
        drafted = f"head `{rep['head'] or 'shipped default head'}`"
    else:
        opts = ", ".join(f"{k}={v}" for k, v in (rep.get("drafter_options") or {}).items())
        drafted = f"drafter `{drafter}`" + (f" ({opts})" if opts else "") + (f", head `{rep['head']}`" if rep["head"] else "")
    L += [f"Model `{rep['model']}`, {drafted}; paper numbers beside ours: "
          f"{rep.get('paper_label') or 'none'}. Methods {', '.join(method_label(m) for m in rep['methods'])}; "
          f"Δ = paired change vs {method_label(rep['reference'])} in percent.", ""]
    nq = len(rep["question_ids"])
    setname = {"report": f"the **report set**: Spec-Bench questions outside the head's selection set (the first "
                         f"{rep['selection_per_category']} of each category group, `select_questions(per_category="
                         f"{rep['selection_per_category']})`, on which heads were compared stage to stage)",
               "selection": "the **selection set** (the questions the head was chosen on: not an unbiased result)",
               "all": "all questions (the head's selection set included)"}[rep["question_set"]]
    L += [f"Questions: {nq} from {setname}; ids {_ids_text(rep['question_ids'])}. Seeds {rep['seeds']}; plain-decoding "
          f"reference of {rep['max_new_tokens']} new tokens per turn; {rep['contexts_per_question']} shared contexts "
          f"per question (fewer where a table says so), {rep['draws']} tree draw(s) per drafting rule and context.", ""]
    L += ["Every number is the **exact expected τ** (E[tokens per cycle | drafted tree] from each verifier's outcome "
          "law) on shared contexts, averaged over contexts per group and then over groups (Avg, as Table 1); ± is "
          "the bootstrap SE over questions (paired across methods for Δ). Verdict: *same sign, significant* when "
          f"|Δ| > {SIGNIFICANT_Z:g} SE with the paper's sign; *within noise* when |Δ| ≤ {SIGNIFICANT_Z:g} SE; "
          "*opposite sign, significant* otherwise. Exact τ weighs every context (token position) alike while a "
          "run's τ weighs every cycle alike, so compare Δ (relative), not τ's level; the model is not the paper's.",
          ""]
    if rep["missing_units"]:
        L += [f"**Incomplete: {len(rep['missing_units'])} of {rep['n_units']} units missing** (e.g. "
              f"{', '.join(rep['missing_units'][:4])}); rerun the same command to finish them.", ""]

    # verdict table
    L += ["## Paper cell by cell", "",
          "| Table | T | tree | method | paper τ | paper Δ | ours τ (Avg) | ours Δ | verdict |",
          "|---|---:|---|---|---:|---:|---:|---:|---|"]
    for v in rep["verdicts"]:
        if v["method"] == rep["reference"] and v["layout"] == "depth_width":
            continue
        pt = _num(v["paper_tau"], 2)
        pdl = _num(v["paper_delta_pct"], 1, sign=True, suffix="%") if v["paper_delta_pct"] is not None else (
            "≈0 (note)" if v.get("paper_note") else "-")
        L.append(f"| {v['table']} | {v['temperature']:g} | {v['tree']} | {method_label(v['method'])} | {pt} | {pdl} | "
                 f"{_pm(v['tau'], 3)} | {'-' if v['method'] == rep['reference'] else _pm(v['delta_pct'], 1, '%', True)} | "
                 f"{v['verdict']} |")
    codes = [v["code"] for v in rep["verdicts"]]
    L += ["", f"Summary: {codes.count('same')} same sign and significant, {codes.count('noise')} within noise, "
              f"{codes.count('opposite')} opposite sign and significant, {codes.count('no_paper')} significant where "
              f"the paper has no number, {codes.count('note_ok')} consistent with a paper note, "
              f"{codes.count('note_differs')} differ from a note, {codes.count('identical')} identical to the "
              f"reference, {codes.count('skipped')} not run. "
              "Paper values: Avg τ only (its per-group cells are not on record here); '-' = no paper number on record.",
          ""]
    opp = [v for v in rep["verdicts"] if v["code"] == "opposite"]
    if opp:
        L += ["### Why the opposite-sign cells differ (measured)", ""]
        seen = set()
        for v in opp:
            if (v["temperature"], v["tree"], v["method"]) in seen:
                continue
            seen.add((v["temperature"], v["tree"], v["method"]))
            L.append(f"- {v['table']}, T={v['temperature']:g}, {v['tree']}, {method_label(v['method'])} vs "
                     f"{method_label(rep['reference'])}: {v.get('reason') or 'no branch table'}.")
        L += ["", "Each cell's full branch-entry table (P(the accepted path enters root child r) / E[tokens through "
                  "it], per method) is printed below its table.", ""]

    for cell in rep["cells"]:
        if cell["layout"] == "groups" and cell.get("exact"):
            L += [f"## {cell['table']} layout (T={cell['temperature']:g}, tree {cell['tree']})", ""]
            L += [X.render_exact(cell["exact"]).strip(), ""]
            pc = cell.get("paper")
            if pc:
                L += [f"Paper ({pc['source']}, {rep.get('paper_label')}): " + ", ".join(
                    f"{method_label(m)} {t:.2f}" for m, t in pc["tau"].items()) + " (Avg only).", ""]

    grid = [c for c in rep["cells"] if c["layout"] == "grid"]
    if grid:
        label = grid[0]["table"]
        L += [f"## {label}: Avg τ and Δ vs {method_label(rep['reference'])}, ours | paper", ""]
        others = [m for m in rep["methods"] if m != rep["reference"]]
        L += ["| T | tree | " + method_label(rep["reference"]) + " τ | " +
              " | ".join(f"{method_label(m)} Δ" for m in others) + " | paper |",
              "|---:|---|---:|" + "---:|" * len(others) + "---|"]
        for c in grid:
            ex = c.get("exact")
            rows = {r["method"]: r for r in ex["rows"]} if ex else {}
            pc, note = c.get("paper"), c.get("paper_note")
            paper = ("; ".join(f"{method_label(m)} {t:.2f}" for m, t in pc["tau"].items()) if pc else
                     (note["text"] if note else "no number on record"))
            L.append(f"| {c['temperature']:g} | {c['tree']} | {_pm((rows.get(rep['reference']) or {}).get('avg_tau'), 3)} | "
                     + " | ".join(_pm((rows.get(m) or {}).get("delta_pct"), 1, "%", True) for m in others)
                     + f" | {paper} |")
        L.append("")
        for c in grid:
            ex = c.get("exact")
            if ex and any(v["code"] == "opposite" and v["tree"] == c["tree"] and v["temperature"] == c["temperature"]
                          for v in rep["verdicts"]):
                L += [f"Branch entry, T={c['temperature']:g}, {c['tree']}:", ""]
                L += [ln for ln in X._render_branches(ex) if ln != ""][1:] + [""]

    dw = [c for c in rep["cells"] if c["layout"] == "depth_width"]
    if dw:
        label = dw[0]["table"]
        others = [m for m in rep["methods"] if m != rep["reference"]]
        L += [f"## {label}: Δ vs {method_label(rep['reference'])} as the tree deepens (D) and widens (K), KxD = the "
              f"full K-ary tree of depth D", ""]
        L += ["| tree | draft nodes | " + method_label(rep["reference"]) + " τ | " +
              " | ".join(f"{method_label(m)} Δ" for m in others) + " |", "|---|---:|---:|" + "---:|" * len(others)]
        for c in dw:
            if c.get("skipped"):
                L.append(f"| {c['tree']} | {tree_nodes(c['tree']) - 1} | not run ({c['skipped']}) |" + " |" * len(others))
                continue
            ex = c.get("exact")
            rows = {r["method"]: r for r in ex["rows"]} if ex else {}
            L.append(f"| {c['tree']} | {tree_nodes(c['tree']) - 1} | "
                     f"{_pm((rows.get(rep['reference']) or {}).get('avg_tau'), 3)} | "
                     + " | ".join(_pm((rows.get(m) or {}).get("delta_pct"), 1, "%", True) for m in others) + " |")
        L += ["", "The paper's Figure 4 values are not on record here (no paper column).", ""]

    sm = rep.get("sampled")
    if sm:
        L += [f"## Sampled check (T={sm['temperature']:g}, tree {sm['tree']}, {sm['n_questions']} questions, "
              f"{sm['max_new_tokens']} new tokens per turn)", "",
              "Mean accepted tokens per cycle of real runs (Avg over groups ± bootstrap SE), and the Rao-Blackwellised "
              "τ of the same runs (exact E[tokens | the drafted tree] at each of the run's cycles): the two agree in "
              "expectation; Δ is paired over questions.", "",
              "| method | sampled τ | Δ | RB τ | Δ (RB) |", "|---|---:|---:|---:|---:|"]
        for m in sm["methods"]:
            t, r = sm["tau"][m], (sm["rb_tau"] or {}).get(m)
            L.append(f"| {method_label(m)} | {_pm(t['avg'], 3)} | {_pm(t['delta_pct'], 1, '%', True)} | "
                     f"{_pm((r or {}).get('avg'), 3)} | {_pm((r or {}).get('delta_pct'), 1, '%', True)} |")
        L.append("")
    elif rep.get("sampled") is None:
        pass
    if pngs:
        L += ["## Plots", ""] + [f"![{p}]({p})" for p in pngs] + [""]
    if rep.get("notes"):
        L += ["## Notes", "", rep["notes"], ""]
    return "\n".join(L)


def plot_report(rep: dict, out_dir: Path) -> list[str]:
    """PNG plots: the groups table, Δ vs temperature per tree, Δ vs depth per width (Figure 4)."""
    from evaluation.plots import method_color, plot_exact_tau, plt
    from evaluation.tables import method_label

    out_dir = Path(out_dir)
    names = []
    for c in rep["cells"]:
        if c["layout"] == "groups" and c.get("exact"):
            p = out_dir / f"{c['table'].lower().replace(' ', '')}_groups.png"
            plot_exact_tau(c["exact"], p)
            names.append(p.name)
    others = [m for m in rep["methods"] if m != rep["reference"]]
    grid = [c for c in rep["cells"] if c["layout"] == "grid" and c.get("exact")]
    if grid:
        trees = list(dict.fromkeys(c["tree"] for c in grid))
        fig, axes = plt.subplots(1, len(trees), figsize=(4 * len(trees), 3.4), sharey=True, squeeze=False)
        for ax, tree in zip(axes[0], trees):
            cs = sorted((c for c in grid if c["tree"] == tree), key=lambda c: c["temperature"])
            for j, m in enumerate(others):
                pts = [(c["temperature"], r["delta_pct"]) for c in cs for r in c["exact"]["rows"]
                       if r["method"] == m and r["delta_pct"]]
                x = [p[0] + 0.012 * (j - 1) for p in pts]
                ax.errorbar(x, [p[1]["mean"] for p in pts], yerr=[p[1]["se"] or 0 for p in pts], marker="o",
                            capsize=3, color=method_color(m), label=method_label(m))
                for c in cs:
                    pd = c.get("paper") and c["paper"]["tau"].get(m)
                    if pd:
                        ax.plot([c["temperature"]], [100 * (pd / c["paper"]["tau"][rep["reference"]] - 1)], marker="*",
                                ms=11, ls="none", color=method_color(m), markeredgecolor="k")
            ax.axhline(0, color="k", lw=0.8)
            ax.set_title(f"tree {tree}", fontsize=9)
            ax.set_xlabel("temperature")
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7)
        names.append(_save_panels(fig, axes, rep, "exact τ, Δ ± SE (stars: paper)", out_dir / "table3_delta.png"))
    dw = [c for c in rep["cells"] if c["layout"] == "depth_width" and c.get("exact")]
    if dw:
        import re

        widths = sorted({int(re.match(r"(\d+)x", c["tree"]).group(1)) for c in dw})
        fig, axes = plt.subplots(1, len(others), figsize=(4 * len(others), 3.4), sharey=True, squeeze=False)
        styles = ["-", "--", ":", "-."]
        for ax, m in zip(axes[0], others):
            for wi, k in enumerate(widths):
                cs = sorted((c for c in dw if c["tree"].startswith(f"{k}x")), key=lambda c: int(c["tree"].split("x")[1]))
                pts = [(int(c["tree"].split("x")[1]), r["delta_pct"]) for c in cs for r in c["exact"]["rows"]
                       if r["method"] == m and r["delta_pct"]]
                ax.errorbar([p[0] + 0.06 * wi for p in pts], [p[1]["mean"] for p in pts],
                            yerr=[p[1]["se"] or 0 for p in pts], marker="o", capsize=3, ls=styles[wi % 4],
                            color=method_color(m), alpha=1 - 0.2 * wi, label=f"K={k}")
            ax.axhline(0, color="k", lw=0.8)
            ax.set_title(method_label(m), fontsize=9)
            ax.set_xlabel("tree depth D")
            ax.set_xticks(sorted({int(c["tree"].split("x")[1]) for c in dw}))
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        names.append(_save_panels(fig, axes, rep, "exact τ on KxD trees, Δ ± SE", out_dir / "figure4_delta.png"))
    return names


def _save_panels(fig, axes, rep: dict, title: str, path: Path) -> str:
    """Label the first panel's y axis, title the figure (SMOKE RUN when --quick), write the PNG; its file name."""
    from evaluation.plots import plt
    from evaluation.tables import method_label

    axes[0][0].set_ylabel(f"Δ τ vs {method_label(rep['reference'])} (%)")
    fig.suptitle(("SMOKE RUN: " if rep["quick"] else "") + title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def write_report(s: Setting, questions: Sequence[dict], out: Path, plots: bool = True) -> tuple[dict, Path]:
    rep = build_report(s, questions, out)
    d = Path(out) / s.name
    d.mkdir(parents=True, exist_ok=True)
    pngs = plot_report(rep, d) if plots else []
    (d / "report.json").write_text(json.dumps(rep, indent=1) + "\n", encoding="utf-8")
    md = render_report(rep, pngs)
    (d / "report.md").write_text(md, encoding="utf-8")
    return rep, d / "report.md"


# ------------------------------------------------------------------------------------------- dry run
def estimate_cost(s: Setting, units: Sequence[dict], questions: Sequence[dict]) -> dict:
    """Rough seconds per unit kind from the setting's cost model (decode steps; REFERENCE section 7 on the CPU).

    Per context: one prefill of ``context_tokens / prefill_tokens_per_step`` steps; per tree, context and drafting
    rule: drafting
    ``0.6 * levels * (1 + nodes / 200)``, target forward over the tree ``1.35 + 0.068 * nodes``, verification
    ``0.2 * nodes / 62`` per method. Reference: one step per new token. Sampled: cycles of ~2.5 tokens.
    """
    c = s.cost
    step = float(c["decode_step_s"])
    prefill = float(c["context_tokens"]) / float(c["prefill_tokens_per_step"])
    by_id = {int(q["question_id"]): q for q in questions}
    rules = 2 if any(m in ("greedy", "univer") for m in s.methods) and any(m in ("rrsw", "traversal") for m in s.methods) else 1
    per_methods = len(s.methods)

    def tree_steps(tree: str) -> float:   # without the prefill (one per context, shared by its trees)
        n = tree_nodes(tree) - 1
        return 0.6 * tree_levels(tree) * (1 + n / 200) + 1.35 + 0.068 * n + 0.2 * per_methods * n / 62

    total, ref, trees_s, samp = 0.0, 0.0, 0.0, 0.0
    per_tree: dict[str, float] = {}
    for u in units:
        turns = len(by_id[u["question_id"]]["turns"])
        if u["kind"] == "exact":
            ref += turns * s.max_new_tokens * step
            for cpq in {int(j.rsplit("@", 1)[1]) for j in u["jobs"]}:
                trees_s += cpq * prefill * step
            for job in u["jobs"]:
                tree, cpq = job.rsplit("@", 1)
                secs = int(cpq) * rules * s.draws * tree_steps(tree) * step
                per_tree[tree] = per_tree.get(tree, 0.0) + secs
                trees_s += secs
        else:
            cycles = turns * s.sampled["max_new_tokens"] / 2.5
            samp += len(u["methods"]) * cycles * (tree_steps(u["tree"]) + 0.5) * step
    total = ref + trees_s + samp
    return {"total_s": total, "reference_s": ref, "trees_s": trees_s, "sampled_s": samp, "per_tree_s": per_tree,
            "device_label": c["device_label"]}


def _hms(sec: float) -> str:
    sec = int(round(sec))
    return f"{sec // 3600}h{sec % 3600 // 60:02d}m" if sec >= 3600 else f"{sec // 60}m{sec % 60:02d}s"


def dry_run_text(s: Setting, questions: Optional[Sequence[dict]], shard: tuple[int, int] = (0, 1),
                 processes: int = 1, out: Optional[Path] = None) -> str:
    """The cells, units and cost estimate of a setting, without loading any model."""
    from evaluation.paper import PAPER_MODELS, paper_cell, paper_delta_pct, paper_note
    from evaluation.speed import order_groups
    from evaluation.tables import method_label

    from evaluation.questions import category_group

    L = [f"== {s.name} ({s.path}){' --quick' if s.quick else ''}"]
    head = s.head or ("(shipped default head)" if s.model == "default" else "none")
    L.append(f"model {s.model}  head {head}  drafter {s.drafter_text()}")
    pm = PAPER_MODELS.get(s.paper_model or "")
    L.append(f"paper numbers: {pm['label'] + ' (' + pm['tables'] + ')' if pm else 'none'}")
    L.append(f"methods {s.methods}, reference {s.reference}, seeds {s.seeds}, {s.max_new_tokens} new tokens per turn, "
             f"{s.contexts_per_question} contexts per question, {s.draws} draw(s)")
    if questions is None:
        L.append(f"questions: set {s.question_set!r}, {s.per_category or 'all'} per group (question file not here: "
                 f"no unit count)")
    else:
        groups = order_groups({category_group(q["category"]) for q in questions})
        counts = {g: sum(category_group(q["category"]) == g for q in questions) for g in groups}
        L.append(f"questions: set {s.question_set!r} ({len(questions)}: "
                 + ", ".join(f"{g} {n}" for g, n in counts.items()) + ")")
    L.append("cells (table, T, tree: paper Avg τ of " + "/".join(method_label(m) for m in s.methods)
             + " and Δ UniVer):")
    width = max(len(b.table) for b in s.blocks)
    for b in s.blocks:
        for t in b.temperatures:
            for tree in b.trees:
                pc = paper_cell(s.paper_model, t, tree)
                note = paper_note(s.paper_model, t)
                paper = ("paper " + "/".join(f"{pc['tau'].get(m, float('nan')):.2f}" for m in s.methods)
                         + f" (UniVer {paper_delta_pct(pc, 'univer', s.reference):+.1f}%, {pc['source']})"
                         if pc else (f"paper note: {note['text']}" if note else "paper: no number on record"))
                skip = f"  SKIPPED: {b.skipped[tree]}" if tree in b.skipped else ""
                L.append(f"  {b.table:{width}s} T={t:<4g} {tree:13s} {paper}{skip}")
    if questions is None:
        return "\n".join(L)
    units = plan_units(s, questions)
    est = estimate_cost(s, units, questions)
    mine = units[shard[0]::shard[1]]
    L.append(f"units: {len(units)} ({sum(u['kind'] == 'exact' for u in units)} exact, "
             f"{sum(u['kind'] == 'sampled' for u in units)} sampled)"
             + (f"; this shard {shard[0]}/{shard[1]}: {len(mine)}" if shard[1] > 1 else ""))
    L.append(f"cost estimate ({est['device_label']}, rough): {_hms(est['total_s'])} in one process = reference "
             f"{_hms(est['reference_s'])} + trees {_hms(est['trees_s'])} + sampled check {_hms(est['sampled_s'])}; "
             f"{_hms(est['total_s'] / max(processes, 1))} with {processes} processes")
    top = sorted(est["per_tree_s"].items(), key=lambda kv: -kv[1])[:5]
    L.append("  costliest trees: " + ", ".join(f"{t} {_hms(v)}" for t, v in top))
    if out is not None:
        L.append(measured_cost_text(s, units, Path(out), processes))
    return "\n".join(L)


def measured_cost_text(s: Setting, units: Sequence[dict], out: Path, processes: int = 1) -> str:
    """Units done in ``out`` and the time they took (as measured on this machine), and the rest projected."""
    udir = units_dir(out, s)
    done, secs = {"exact": 0, "sampled": 0}, {"exact": 0.0, "sampled": 0.0}
    left = {"exact": 0, "sampled": 0}
    for u in units:
        rec = _read_unit(udir / f"{u['id']}.json")
        try:
            ok = unit_done(s, u, rec)
        except ConfigError:
            ok = False
        if ok:
            done[u["kind"]] += 1
            secs[u["kind"]] += sum(rec.get("seconds", {}).values())
        else:
            left[u["kind"]] += 1
    if not any(done.values()):
        return f"measured: no unit of this plan done yet in {out}"
    proj = sum(secs[k] / done[k] * left[k] for k in done if done[k])
    unknown = [k for k in done if left[k] and not done[k]]
    return (f"measured in {out}: {sum(done.values())} units done, {_hms(sum(secs.values()))} of unit time; the "
            f"{sum(left.values())} left at that pace: {_hms(proj)} in one process, {_hms(proj / max(processes, 1))} "
            f"with {processes}" + (f" (plus the {', '.join(unknown)} units, none measured yet)" if unknown else ""))


# ------------------------------------------------------------------------------------------------ main
def _parser() -> argparse.ArgumentParser:
    from evaluation.arguments import OneLineParser

    ap = OneLineParser(prog="reproduce", description="Reproduce the paper's tables from setting files (resumable, "
                                                     "sharded); see the module docstring.")
    ap.add_argument("configs", nargs="*", default=None, help=f"setting files (default {DEFAULT_CONFIG.relative_to(REPO)})")
    ap.add_argument("--out", default=None, help="output folder (default runs/reproduce, runs/reproduce-quick with --quick)")
    ap.add_argument("--quick", action="store_true", help="apply each setting's 'quick' overrides (a smoke run)")
    ap.add_argument("--dry-run", action="store_true", help="list cells, units and a cost estimate; load nothing")
    ap.add_argument("--shard", default=None, help="i/n: run units i, i+n, ... (default: from RANK/WORLD_SIZE, else 0/1)")
    ap.add_argument("--merge", nargs="*", default=None, metavar="DIR",
                    help="copy units of these shard folders into --out (none: --out already holds them), then report")
    ap.add_argument("--processes", type=int, default=1, help="dry run: processes the cost is split over")
    ap.add_argument("--device", default=None, help="override the setting's device (a sharded GPU run: cuda:LOCAL_RANK)")
    ap.add_argument("--no-report", action="store_true", help="run units only (shards do this by themselves)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    return ap


def main(argv: Optional[Sequence[str]] = None, *, loader: Optional[Callable] = None) -> int:
    args = _parser().parse_args(argv)
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, flush=True))
    configs = args.configs or [str(DEFAULT_CONFIG)]
    out = Path(args.out or ("runs/reproduce-quick" if args.quick else "runs/reproduce"))
    try:
        if args.shard is not None:
            shard, local = parse_shard(args.shard), None
        else:
            r, w, local = detect_shard()
            shard = (r, w)
        settings = [load_setting(c, quick=args.quick) for c in configs]
        names = [s.name for s in settings]
        if len(set(names)) != len(names):
            raise ConfigError(f"two settings share the name {names}")
        for s in settings:
            if args.dry_run:
                try:
                    qs = pick_questions(s, download=False)
                except ConfigError:
                    qs = None
                print(dry_run_text(s, qs, shard, args.processes, out if (out / s.name).is_dir() else None))
                continue
            qs = pick_questions(s)
            device = args.device
            if device is None and local is not None and shard[1] > 1:
                import torch

                if torch.cuda.is_available() and s.device in ("auto", "cuda"):
                    device = f"cuda:{local}"
            if args.merge is not None:
                n = merge_units(s, out, [Path(p) for p in args.merge])
                log(f"== {s.name}: merged {n} unit file(s) into {units_dir(out, s)}")
            else:
                res = run_units(s, qs, out, shard, loader=loader, device=device, log=log)
                log(f"== {s.name}: shard {shard[0]}/{shard[1]} ran {res['ran']} units in {res['seconds']:.0f} s")
            sharded = shard[1] > 1 and args.merge is None
            if not args.no_report and not sharded:
                rep, md = write_report(s, qs, out, plots=not args.no_plots)
                log(f"== {s.name}: report {md}" + (f" (INCOMPLETE: {len(rep['missing_units'])} units missing)"
                                                    if rep["missing_units"] else ""))
            elif sharded:
                log(f"== {s.name}: shard done; when every shard is done: python -m evaluation.reproduce "
                    f"{' '.join(configs)} --out {out}{' --quick' if args.quick else ''} --merge")
    except ConfigError as e:
        print(f"reproduce: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
