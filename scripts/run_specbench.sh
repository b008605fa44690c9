#!/usr/bin/env bash
# Spec-Bench main job: plain decoding + every registered verifier over seeds, then metrics with bootstrap
# errors, the paper's Table-1 layout, exact expected tau on shared contexts, the time breakdown and plots.
#
# Usage: scripts/run_specbench.sh [MODEL] [TEMPERATURE] [options]
#   MODEL        "default" (embedded SmolLM2-135M-Instruct + our head; the default), a hub id or a folder
#   TEMPERATURE  sampling temperature (default 1.0)
# Options (all checked before any work: a bad value fails in seconds with one line naming the flag):
#   --head PATH            EAGLE-1 head folder or hub id (required for a non-default MODEL)
#   --tree T               tree the verifiers are compared on: mc_sim_7b_63 | KxD (e.g. 2x5, 3x3) | chainD |
#                          auto   (default: 2x5, the paper's)
#   --speed-tree T         a second tree for the speed table, sharing plain decoding: auto | a --tree value |
#                          none   (default for the embedded default on the CPU: the API's default tree
#                          eagle2:nodes=5,depth=2,topk=3 where the drafter and --speed-methods can draft it, else
#                          auto = fitted to this machine and head; none elsewhere)
#   --speed-methods "univer"  verifiers run on --speed-tree (default: univer at T > 0, else the first method)
#   --seeds "0 1 2"        seeds (default "0 1 2")
#   --per-category N       N questions per category group (mt_bench: N in total over its 8 sub-categories);
#                          default: all 480 questions
#   --max-new-tokens N     per turn (default 256)
#   --methods "rrsw univer"  verifiers (default: every registered verifier usable at TEMPERATURE);
#                          the plain-decoding baseline "naive" always runs
#   --plugin MODULE        import MODULE first so the verifiers it registers can be run (repeatable);
#                          univer_patch (traversal, greedy, univer) is always imported
#   --template NAME        prompt format: a FastChat template (e.g. vicuna_v1.1) or chat_template; default:
#                          the tokenizer's chat template, else the known family's format (Vicuna -> vicuna_v1.1)
#   --question-file PATH   Spec-Bench question.jsonl (default data/spec_bench/question.jsonl, downloaded
#                          and sha256-checked if absent)
#   --out DIR              output folder (default runs/specbench/<model>-temp<T>-<tree>[-quick])
#   --threads N            CPU only: torch threads (default 1; 0 = torch's default)
#   --draft-vocab auto|off draft over the head's draft vocabulary when it ships one (auto, default) or over
#                          the full vocabulary (off); lossless either way, tau and speed differ
#   --contexts-per-question N   exact tau: shared contexts per question (default 8; 0 = skip)
#   --draws N              exact tau: tree draws per drafting rule and context (default 1)
#   --bootstrap N          bootstrap resamples over questions (default 1000)
#   --device, --dtype      auto (CUDA + float16 when available, else CPU + float32)
#   --quick                SMOKE RUN: 1 seed, 2 questions per group, 16 new tokens, 1 exact-tau context
#                          per question; options given explicitly win. Labelled as a smoke run everywhere.
# --help (anywhere on the line) prints every option, also those not listed here (--drafter, --question-set,
# --expected-tau, --categories, --top-p, --top-k, --no-plots, ...). Relative paths are taken from the folder
# you run the command in.
# Outputs in DIR: answers/*.jsonl (Spec-Bench format + provenance), speed.json, table1.md/.json, speed_table.md,
#   exact_tau.md/.json, tau_by_group.png, tau_expected_by_group.png, exact_tau.png, speedup.png,
#   time_breakdown.png, run.json (settings, provenance, seconds per stage).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY="python"; fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m evaluation.specbench "$@"
