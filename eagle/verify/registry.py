"""The verifier registry: a verifier is data, one generic door runs them all.

A :class:`Verifier` is ``(name, drafting rule, kernel, outcome_law, temperature-0-only flag)``.
:meth:`Verifier.verify` validates the inputs once for the declared drafting rule, draws the
uniforms with the caller's generator on the laws' device and calls the kernel;
:meth:`Verifier.outcome_probs` gives the exact law. The generation loop talks only to this
registry (:func:`select_verifier` once per call).

``eagle`` registers ``rrsw`` (EAGLE-1) and ``argmax`` (temperature 0). Other verifiers are plugins
that register themselves when imported: ``univer_patch`` (``traversal``, ``greedy``, ``univer``),
imported explicitly (``import univer_patch`` or :func:`load_plugin`) or, for an installed
distribution, through the entry-point group :data:`ENTRY_POINT_GROUP`, which
:func:`available_verifiers` and :func:`get_verifier` load. ``eagle`` never imports a plugin by name.

Common tree form of one verification step (every verifier takes exactly this):
    parents:      LongTensor [N]; node 0 is the root (parent -1); parents[i] < i; siblings in
                  rank order have increasing index.
    tokens:       LongTensor [N]; tokens[0] is the root token.
    target_probs: float Tensor [N, V]; row i = M_b(. | node i), processed (temperature/top-p/top-k).
    draft_probs:  float Tensor [N, V]; row i = the full processed draft law M_s(. | node i) that
                  node i's children were drawn from (before any removal). Rows of leaves are unused.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import torch

from ..plugins import load_entry_points
from ..rules import DRAFTING_RULES
from ..tree.structure import TreeStructure
from .checks import compute_dtype, prepare_step

__all__ = ["Verifier", "same_device", "DRAFTING_RULES", "ENTRY_POINT_GROUP", "register_verifier", "unregister_verifier",
           "get_verifier", "available_verifiers", "select_verifier", "load_plugin"]

#: entry-point group through which installed packages add verifiers (each entry point names a
#: module, or an object in one, whose import registers them)
ENTRY_POINT_GROUP = "univer_eagle.verifiers"

#: ``kernel(st, tokens [N] long, target_probs [N, V], draft_probs [N, V], uniforms float64 [N, 2])
#: -> (node, y)``: one decision as a pure function of the uniforms (inputs already validated); node
#: and y are 0-d LongTensors on the laws' device (read once by :meth:`Verifier.verify`) or ints
#: (the kernel then read them itself)
KernelFn = Callable[[TreeStructure, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple]
#: ``outcome_law(st, tokens, target_probs, draft_probs) -> [N, V]``: the exact law of the outcome
LawFn = Callable[..., torch.Tensor]


def same_device(generator_device, laws_device) -> bool:
    """Whether a generator on ``generator_device`` draws the uniforms on ``laws_device``.

    Same type, and the same index where both name one. A device without an index means the
    current one: ``torch.Generator(device="cuda")`` reports ``cuda`` and draws on the current CUDA
    device, so it matches laws on ``cuda:0`` when that is current (torch's own ``==`` says no).
    """
    a, b = torch.device(generator_device), torch.device(laws_device)
    if a.type != b.type:
        return False
    if a.index is not None and b.index is not None:
        return a.index == b.index
    if a.type == "cuda" and torch.cuda.is_available():
        cur = torch.cuda.current_device()
        return (cur if a.index is None else a.index) == (cur if b.index is None else b.index)
    return True


@dataclass(frozen=True)
class Verifier:
    """A verification method, as data.

    Attributes:
        name: registry key (e.g. ``"rrsw"``), lower case.
        drafting: the drafting rule its losslessness proof assumes, one of :data:`DRAFTING_RULES`.
        kernel: one decision, ``(st, tokens, target_probs, draft_probs, uniforms) -> (node, y)``;
            ``uniforms`` is float64 ``[N, 2]`` in [0, 1) on the laws' device; node and y are 0-d
            LongTensors on that device (no host read inside the kernel; :meth:`verify` reads both
            at once) or ints.
        outcome_law: ``(st, tokens, target_probs, draft_probs, **options) -> [N, V]``: entry
            ``[i, y]`` = P(node i ends the accepted path and the next token is y); called on
            float64 rows normalised to sum 1.
        description: one line for ``--help`` texts and the README.
        temperature_zero_only: lossless only for one-hot target laws (temperature 0); never
            listed by ``available_verifiers(temperature=t)`` for t > 0.

    Raises:
        ValueError: on an empty name, an unknown drafting rule or a kernel / law that is not callable.
    """

    name: str
    drafting: str
    kernel: KernelFn
    outcome_law: LawFn
    description: str = ""
    temperature_zero_only: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"verifier name must be a non-empty string, got {self.name!r}")
        if self.drafting not in DRAFTING_RULES:
            raise ValueError(f"verifier {self.name!r}: unknown drafting rule {self.drafting!r}; use one of {DRAFTING_RULES}")
        if not callable(self.kernel) or not callable(self.outcome_law):
            raise ValueError(f"verifier {self.name!r}: kernel and outcome_law must be callable")

    def verify(self, parents: torch.Tensor, tokens: torch.Tensor, target_probs: torch.Tensor,
               draft_probs: torch.Tensor, generator: torch.Generator | None = None, *,
               validate: bool = True, structure: TreeStructure | None = None) -> tuple[int, int]:
        """Sample one outcome.

        Args:
            parents, tokens: LongTensor ``[N]``; target_probs, draft_probs: float ``[N, V]`` (the
                common tree form), children drawn with :attr:`drafting`.
            generator: optional ``torch.Generator`` on the laws' device; the uniforms (float64
                ``[N, 2]``) are drawn with it on that device.
            validate: check the inputs (:func:`~eagle.verify.checks.check_tree_inputs`) and divide
                rows summing to 1 only within the tolerance by their sums. ``False`` is for laws
                the caller built itself (the engine's softmax rows): no checks, but float16 /
                bfloat16 laws are still upcast to float32 and renormalised.
            structure: the tree's :class:`~eagle.tree.structure.TreeStructure` if the caller has it
                (``tree_structure(tuple(parents))``): with ``validate=False`` no host copy of
                ``parents`` is made.

        Returns:
            ``(node_index, next_token)`` ints: the last accepted node and the token after it.

        Raises:
            ValueError: on invalid inputs (the message names the node), with ``validate``; always:
                a generator that is not a ``torch.Generator`` or is on another device than the laws.
        """
        if generator is not None and not hasattr(generator, "device"):
            raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        device = getattr(target_probs, "device", None)
        if generator is not None and device is not None and not same_device(generator.device, device):
            if device.type == "meta":
                raise ValueError("target_probs and draft_probs are on the meta device (no values): verification "
                                 "needs real laws")
            raise ValueError(f"generator is on {generator.device} but the laws are on {device}: the "
                             f"uniforms are drawn on the laws' device, so make the generator there "
                             f"(torch.Generator(device={str(device)!r}))")
        st, tokens, target_probs, draft_probs = prepare_step(parents, tokens, target_probs, draft_probs,
                                                             self.drafting, validate, structure=structure)
        uniforms = torch.rand(st.num_nodes, 2, generator=generator, dtype=torch.float64, device=target_probs.device)
        node, y = self.kernel(st, tokens, target_probs, draft_probs, uniforms)
        if isinstance(node, torch.Tensor) and isinstance(y, torch.Tensor):  # one host read of the outcome
            node, y = torch.stack([node.reshape(()), y.reshape(()).to(node.dtype)]).tolist()
        return int(node), int(y)

    def outcome_probs(self, parents: torch.Tensor, tokens: torch.Tensor, target_probs: torch.Tensor,
                      draft_probs: torch.Tensor, *, validate: bool = True, structure: TreeStructure | None = None,
                      **options) -> torch.Tensor:
        """Exact law of the outcome.

        Computed in float64 on the rows divided by their sums (the law of the normalised rows).
        ``options`` go to :attr:`outcome_law` (test-only negative controls such as ``_broken``);
        ``structure`` as in :meth:`verify`.

        Returns:
            ``[N, V]`` in the dtype the kernels compute in (float32 for float16 / bfloat16 laws,
            float64 if either law is float64): entry ``[i, y]`` = P(node i ends the accepted path
            and the next token is y). Sums to 1.

        Raises:
            ValueError: on invalid inputs, with ``validate``.
        """
        dtype = compute_dtype(target_probs.dtype, draft_probs.dtype)
        st, tokens, target_probs, draft_probs = prepare_step(parents, tokens, target_probs, draft_probs,
                                                             self.drafting, validate, exact=True,
                                                             structure=structure)
        return self.outcome_law(st, tokens, target_probs, draft_probs, **options).to(dtype)


_REGISTRY: dict[str, Verifier] = {}
_PLUGINS_LOADED = False


def register_verifier(v: Verifier, overwrite: bool = False) -> Verifier:
    """Add ``v`` to the registry under ``v.name.lower()``.

    Raises:
        ValueError: if the name is taken by another verifier (and ``overwrite`` is False).
    """
    if not isinstance(v, Verifier):
        raise ValueError(f"register_verifier takes a Verifier, got {type(v).__name__}")
    key = v.name.lower()
    if key in _REGISTRY and not overwrite and _REGISTRY[key] != v:
        raise ValueError(f"verifier {v.name!r} is already registered")
    _REGISTRY[key] = v
    return v


def unregister_verifier(name: str) -> None:
    """Remove a verifier (tests that register temporary ones). Unknown names are ignored."""
    _REGISTRY.pop(str(name).lower(), None)


def load_plugin(module: str):
    """Import the module ``module``, whose import registers verifiers (e.g. ``"univer_patch"``).

    Returns the module. Raises ``ValueError`` naming it if it cannot be imported.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"verifier plugin {module!r} cannot be imported: {e}") from e


def _load_entry_points() -> None:
    """Load the installed plugins of :data:`ENTRY_POINT_GROUP` (once; a broken one warns)."""
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED = True
    load_entry_points(ENTRY_POINT_GROUP, "verifier")


def available_verifiers(temperature: float | None = None) -> list[str]:
    """Sorted names of the registered verifiers (after loading the installed plugins).

    Args:
        temperature: ``None`` or 0: every verifier (at temperature 0 the engine runs ``argmax``
            whatever the name). ``> 0``: only those lossless there (temperature-0-only ones left out).
    """
    _load_entry_points()
    hot = temperature is not None and float(temperature) > 0
    return sorted(k for k, v in _REGISTRY.items() if not (hot and v.temperature_zero_only))


def get_verifier(name_or_verifier) -> Verifier:
    """Look a verifier up by name (a :class:`Verifier` passes through).

    Raises:
        ValueError: for an unknown name (the message lists the known ones and how to add plugins).
    """
    if isinstance(name_or_verifier, Verifier):
        return name_or_verifier
    name = str(name_or_verifier).lower()
    if name not in _REGISTRY:
        _load_entry_points()
    if name not in _REGISTRY:
        raise ValueError(f"unknown verifier {name_or_verifier!r}; known: {sorted(_REGISTRY)} "
                         f"(traversal, greedy and univer need `import univer_patch`, or the installed package)")
    return _REGISTRY[name]


def select_verifier(name_or_verifier, temperature: float) -> Verifier:
    """The verifier one generation call uses: ``argmax`` at temperature 0 (every method then drafts
    the top-k tree and takes the longest greedy match), else the named one.

    Raises:
        ValueError: unknown name, or a temperature-0-only verifier asked for at temperature > 0.
    """
    v = get_verifier(name_or_verifier)
    if float(temperature) == 0.0:
        return get_verifier("argmax")
    if v.temperature_zero_only:
        raise ValueError(f"verifier {v.name!r} is for temperature 0 only (got temperature {temperature}); "
                         f"use one of {available_verifiers(temperature)}")
    return v
