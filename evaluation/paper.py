"""The UniVer paper's published numbers (acceptance length tau), for reports that put ours beside them.

Only what the project has on record (``shared/REFERENCE.md`` section 4) is encoded; every other cell of
the paper is "no number here" (``None``), never a guess. Keys:

* ``PAPER_TAU[paper_model][(temperature, tree)] = {"source": str, "tau": {method: float}}``: Avg tau
  over the Spec-Bench category groups (the paper's per-group cells are not on record).
* ``PAPER_NOTES[paper_model][temperature] = {"source", "text", "max_abs_delta"}``: statements without a
  table of numbers ("at temperature 0.3 all four are within 0.05": every method's tau within
  ``max_abs_delta`` of RRSw's).
* ``PAPER_MODELS[paper_model]``: display label and the paper's table holding that model.
"""
from __future__ import annotations

from typing import Optional

__all__ = ["PAPER_MODELS", "PAPER_TAU", "PAPER_NOTES", "paper_cell", "paper_note", "paper_delta_pct"]

PAPER_MODELS = {
    "vicuna-7b-v1.3": {"label": "Vicuna-7B-v1.3", "tables": "Tables 1 and 3, Figure 4"},
    "vicuna-13b-v1.3": {"label": "Vicuna-13B-v1.3", "tables": "appendix"},
    "vicuna-33b-v1.3": {"label": "Vicuna-33B-v1.3", "tables": "appendix"},
    "llama-3.1-8b-instruct": {"label": "Llama-3.1-8B-Instruct", "tables": "Table 2"},
    "qwen2-7b-instruct": {"label": "Qwen2-7B-Instruct", "tables": "appendix"},
    "llama-2-7b+llama-68m": {"label": "Llama-2-7B with a Llama-68M draft model", "tables": "Table 7"},
}

PAPER_TAU = {
    "vicuna-7b-v1.3": {
        (1.0, "2x5"): {"source": "Table 1 (Avg)",
                       "tau": {"rrsw": 3.06, "traversal": 3.13, "greedy": 3.21, "univer": 3.29}},
        (1.0, "3x3"): {"source": "Table 3",
                       "tau": {"rrsw": 2.89, "traversal": 2.91, "greedy": 3.00, "univer": 3.03}},
        (1.0, "mc_sim_7b_63"): {"source": "Table 3 (EAGLE tree)",
                                "tau": {"rrsw": 3.11, "traversal": 3.16, "greedy": 3.21, "univer": 3.24}},
    },
    "llama-3.1-8b-instruct": {
        (1.0, "2x5"): {"source": "Table 2 (Avg)",
                       "tau": {"rrsw": 2.72, "traversal": 2.78, "greedy": 2.88, "univer": 2.95}},
    },
}

PAPER_NOTES = {
    "vicuna-7b-v1.3": {
        0.3: {"source": "Table 3 (text)", "max_abs_delta": 0.05,
              "text": "at temperature 0.3 all four methods are within 0.05 of each other"},
        0.0: {"source": "Table 3 (text)", "max_abs_delta": 0.0,
              "text": "at temperature 0 all four methods coincide"},
    },
}


def _key(temperature: float, tree: str) -> tuple[float, str]:
    return round(float(temperature), 6), str(tree)


def paper_cell(paper_model: Optional[str], temperature: float, tree: str) -> Optional[dict]:
    """``{"source", "tau": {method: tau}}`` of the paper for this cell, or None (no number on record)."""
    cells = PAPER_TAU.get(paper_model or "", {})
    return cells.get(_key(temperature, tree))


def paper_note(paper_model: Optional[str], temperature: float) -> Optional[dict]:
    """The paper's statement about this temperature (all trees), or None."""
    return PAPER_NOTES.get(paper_model or "", {}).get(round(float(temperature), 6))


def paper_delta_pct(cell: Optional[dict], method: str, reference: str = "rrsw") -> Optional[float]:
    """The paper's ``100 * (tau_method / tau_reference - 1)`` in this cell, or None."""
    if not cell or method not in cell["tau"] or reference not in cell["tau"]:
        return None
    return 100.0 * (cell["tau"][method] / cell["tau"][reference] - 1.0)
