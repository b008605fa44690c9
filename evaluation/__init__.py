"""Spec-Bench harness: questions, prompt formats, answer generation, metrics with errors, tables, exact tau, plots.

Modules (a straight line of imports, top to bottom): :mod:`evaluation.questions`,
:mod:`evaluation.templates` (chat template or FastChat conversation formats),
:mod:`evaluation.arguments` (every CLI argument checked before any work; model loading),
:mod:`evaluation.gen_answer` (answer files in Spec-Bench's format + provenance),
:mod:`evaluation.speed` (tau, tokens/s, speedup, bootstrap errors, time breakdown),
:mod:`evaluation.tables`, :mod:`evaluation.plots`, :mod:`evaluation.exact_tau` (exact expected tau on
shared contexts) and :mod:`evaluation.specbench` (the main job; ``scripts/run_specbench.sh``).
"""
