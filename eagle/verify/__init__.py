"""Verification: the registry of verifiers (``rrsw`` and the temperature-0 ``argmax`` built in).

Importing this package registers the built-in verifiers; plugins such as ``univer_patch`` add
more (see :mod:`eagle.verify.registry`).
"""
from .registry import (DRAFTING_RULES, ENTRY_POINT_GROUP, Verifier, available_verifiers, get_verifier, load_plugin,
                       register_verifier, select_verifier, unregister_verifier)
from . import argmax, rrsw  # noqa: E402,F401  (register "argmax" and "rrsw")

__all__ = ["DRAFTING_RULES", "ENTRY_POINT_GROUP", "Verifier", "available_verifiers", "get_verifier", "load_plugin",
           "register_verifier", "select_verifier", "unregister_verifier"]
