#!/usr/bin/env bash
# Issue 14's acceptance measurement on the CPU default: the main job (plain decoding + speculative
# decoding on the fitted tree, same optimised model) on Spec-Bench, 5 questions per category group,
# 128 new tokens per turn, seed 0, at temperature 0 (rrsw) and 1 (rrsw, univer), for each thread count.
#
#   research/cpu_speedup.sh [OUT] [extra main-job args...]   (OUT default runs/cpu_speedup, relative to
#                                                            the repository root)
#
# THREADS (default "1 2") lists the torch thread counts; PER_CATEGORY (5) and MAX_NEW (128) the size.
# Nothing else should run on the machine meanwhile. Prints each run's Table-1 (tau, tokens/s,
# speedup with bootstrap SEs over questions); the full outputs are in OUT/threads<N>-temp<T>/.
# The fitted trees are measured once per machine, thread count and temperature (cached; refresh
# them first on an idle machine with `python -m evaluation.fit_tree --temperature T --threads N --refresh`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT=runs/cpu_speedup
if [[ $# -gt 0 && $1 != -* ]]; then OUT=$1; shift; fi
THREADS=${THREADS:-"1 2"}
PER_CATEGORY=${PER_CATEGORY:-5}
MAX_NEW=${MAX_NEW:-128}
for th in $THREADS; do
  for temp in 0 1; do
    if [[ $temp == 0 ]]; then methods="rrsw"; else methods="rrsw univer"; fi
    bash "$ROOT/scripts/run_specbench.sh" default "$temp" --tree auto --per-category "$PER_CATEGORY" \
      --max-new-tokens "$MAX_NEW" --seeds 0 --methods $methods --threads "$th" --contexts-per-question 0 \
      --out "$OUT/threads$th-temp$temp" "$@"
  done
done
for f in "$OUT"/threads*-temp*/table1.md; do echo "== $f"; sed -n '1,/^Questions per group/p' "$f"; done
