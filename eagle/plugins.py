"""Entry-point plug-ins, in one place: the verifier and drafter registries load their groups here."""
from __future__ import annotations

import warnings
from importlib import metadata

__all__ = ["load_entry_points"]


def load_entry_points(group: str, kind: str) -> int:
    """Import every installed entry point of ``group`` (their imports register themselves).

    A plug-in that fails to import warns (``"<kind> plugin NAME (VALUE) failed to load: ..."``) instead
    of taking the registry down. Returns the number loaded.
    """
    loaded = 0
    for ep in metadata.entry_points(group=group):
        try:
            ep.load()
            loaded += 1
        except Exception as e:  # noqa: BLE001 - a broken third-party plugin must not break the registry
            warnings.warn(f"{kind} plugin {ep.name!r} ({ep.value}) failed to load: {e!r}", stacklevel=3)
    return loaded
