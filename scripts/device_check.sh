#!/usr/bin/env bash
# GPU check of the engine and the verifiers (issue 11 item 6): <= 5 minutes on one NVIDIA GPU, no internet.
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
