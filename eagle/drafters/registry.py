"""The drafter registry: names -> :class:`~eagle.drafting.Drafter` classes.

``eagle`` registers ``eagle`` (the EAGLE-1 head, :class:`~eagle.drafting.EagleTreeDrafter`) and
``prompt_lookup`` (:class:`~eagle.drafters.prompt_lookup.PromptLookupDrafter`). Other drafters are plug-ins
that register themselves when imported: explicitly, or for an installed distribution through the
entry-point group :data:`ENTRY_POINT_GROUP`, which :func:`available_drafters` and :func:`get_drafter` load
(as ``univer_eagle.verifiers`` does for verifiers, :mod:`eagle.verify.registry`).
"""
from __future__ import annotations


from ..drafting import Drafter
from ..plugins import load_entry_points

__all__ = ["ENTRY_POINT_GROUP", "register_drafter", "unregister_drafter", "get_drafter", "available_drafters",
           "make_drafter"]

#: entry-point group through which installed packages add drafters (each entry point names a module, or an
#: object in one, whose import registers them)
ENTRY_POINT_GROUP = "univer_eagle.drafters"

_REGISTRY: dict[str, type] = {}
_PLUGINS_LOADED = False


def register_drafter(cls: type, overwrite: bool = False) -> type:
    """Add a :class:`Drafter` subclass under ``cls.name.lower()``; usable as a class decorator.

    Raises:
        ValueError: not a Drafter subclass, an empty name, or a name taken by another class (unless ``overwrite``).
    """
    if not (isinstance(cls, type) and issubclass(cls, Drafter)):
        raise ValueError(f"register_drafter takes a Drafter subclass, got {cls!r}")
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"drafter {cls.__name__}: set a non-empty class attribute `name`")
    key = name.lower()
    if key in _REGISTRY and _REGISTRY[key] is not cls and not overwrite:
        raise ValueError(f"drafter {name!r} is already registered (by {_REGISTRY[key].__qualname__}); pass "
                         f"overwrite=True to replace it")
    _REGISTRY[key] = cls
    return cls


def unregister_drafter(name: str) -> None:
    """Remove a drafter (tests that register temporary ones). Unknown names are ignored."""
    _REGISTRY.pop(str(name).lower(), None)


def _load_entry_points() -> None:
    """Load the installed plugins of :data:`ENTRY_POINT_GROUP` (once; a broken one warns)."""
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED = True
    load_entry_points(ENTRY_POINT_GROUP, "drafter")


def available_drafters() -> list[str]:
    """Sorted names of the registered drafters (after loading the installed plug-ins)."""
    _load_entry_points()
    return sorted(_REGISTRY)


def get_drafter(name_or_cls) -> type:
    """The drafter class registered under a name (a Drafter subclass passes through).

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if isinstance(name_or_cls, type) and issubclass(name_or_cls, Drafter):
        return name_or_cls
    if not isinstance(name_or_cls, str) or not name_or_cls.strip():
        raise ValueError(f"drafter must be a registered name, a Drafter class or instance, got {name_or_cls!r}")
    key = name_or_cls.lower()
    if key not in _REGISTRY:
        _load_entry_points()
    if key not in _REGISTRY:
        raise ValueError(f"unknown drafter {name_or_cls!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[key]


def make_drafter(spec, model, **options) -> Drafter:
    """A drafter instance for ``model`` from a name, a class or an instance (passed through)."""
    if isinstance(spec, Drafter):
        return spec
    return get_drafter(spec).for_model(model, **options)
