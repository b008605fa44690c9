#!/usr/bin/env bash
# GPU check of the engine, the verifiers and the harness (issues 11 and 49, item 6): <= 5 minutes on one
# NVIDIA GPU, no internet (host reads per cycle, fp16/bf16 laws, draft vocabularies, pruned trees, the
# main job on a Vicuna-7B-shaped model, 7B cycle vs decode-step timings).
#   bash scripts/device_check.sh            # CUDA; writes device_check.json + .md to $OUT or runs/device_check/
#   bash scripts/device_check.sh --dry-run  # tiny shapes on the CPU (run by the test suite)
# Runs from a source tree (PYTHONPATH=repo root); needs torch and transformers (>= 5.17), nothing else.
# Details: scripts/device_check.py's docstring.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"
if [[ " $* " == *" --dry-run "* ]]; then
  exec "$PY" scripts/device_check.py "$@"
fi
# hard stop at 5 minutes (the script itself skips remaining checks after --budget-s, default 280 s)
exec timeout 300 "$PY" scripts/device_check.py "$@"
