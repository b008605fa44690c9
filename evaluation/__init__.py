"""Spec-Bench harness: question loading, answer generation, metrics (tau, tokens/s, speedup), tables, plots.

Modules: :mod:`evaluation.questions`, :mod:`evaluation.gen_answer`, :mod:`evaluation.speed`,
:mod:`evaluation.tables`, :mod:`evaluation.plots`. ``scripts/run_specbench.sh`` chains them.
"""
