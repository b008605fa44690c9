"""Verification: the registry of verifiers and EAGLE's ``evaluate_posterior``."""
from .registry import DRAFTING_RULES, Verifier, available_verifiers, get_verifier, register_verifier

__all__ = ["DRAFTING_RULES", "Verifier", "available_verifiers", "get_verifier", "register_verifier"]
