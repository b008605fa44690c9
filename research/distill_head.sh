#!/usr/bin/env bash
# Train the default head from the committed self-distillation corpus (data/distill), issue 13's route.
#
#   research/distill_head.sh OUT [extra train args...]
#
# 1. features: the target re-encodes the corpus (token ids -> last hidden states, float16) into
#    ${FEATURES:-cache/features} (outside git, ~1.1 KB per token; only new shards are encoded);
# 2. training: EAGLE-1's loss + the multi-step (training-time test) loss over draft depths 1..UNROLL
#    (default 3, weights 0.8^(d-1)) + ACC_WEIGHT x (1 - acceptance); warm start from INIT (default: the
#    shipped head); the distribution terms over DRAFT_VOCAB's rows (default: INIT's draft vocabulary);
#    held-out = the corpus's held-out split (never trained on; 96 of its sequences are evaluated every
#    20 min, top-1/top-4 per depth 1..5: a full-vocabulary evaluation of all of them would cost minutes);
# 3. the held-out comparison of the new head against INIT (research.heldout).
# SHARDS (default all): only these corpus shard numbers for features and training, e.g. the shards INIT
# has not trained on (153-158,160- for a stage warm-started from stage 3); FEATURES should then be a folder
# holding only those. MAX_LEN (default 768) tokens per sequence. Budgets: TRAIN_MINUTES (default 60) on THREADS (default 2) threads. Logs: OUT.features.log, OUT.train.log.
set -euo pipefail
OUT=${1:?usage: research/distill_head.sh OUT [extra train args]}
shift 1
FEATURES=${FEATURES:-cache/features}
INIT=${INIT:-eagle/data/heads/smollm2-135m-eagle}
UNROLL=${UNROLL:-3}
ACC_WEIGHT=${ACC_WEIGHT:-0.0}
TRAIN_MINUTES=${TRAIN_MINUTES:-60}
# draft vocabulary the CE / acceptance terms are trained on (copied beside the new head); default: INIT's
# when it has one; DRAFT_VOCAB="" trains over the full vocabulary; a given path must exist (train.py checks)
if [ -z "${DRAFT_VOCAB+set}" ]; then
  DRAFT_VOCAB=""
  if [ -n "$INIT" ] && [ -f "$INIT/draft_vocab.safetensors" ]; then DRAFT_VOCAB="$INIT/draft_vocab.safetensors"; fi
fi
THREADS=${THREADS:-2}
# sequences (prompt + answer) are cut to MAX_LEN tokens for features and training: at 512, 12% of the corpus's
# answer tokens (70% of summarisation's, 40% of RAG's) fall beyond the cut; at 768, 2%
MAX_LEN=${MAX_LEN:-768}
PY=${PYTHON:-python}
mkdir -p "$(dirname "$OUT")"

$PY -m eagle.train.features --corpus data/distill --out "$FEATURES" --shards "${SHARDS:-}" --max-len "$MAX_LEN" --threads "$THREADS" 2>&1 | tee "${OUT%/}.features.log"

INIT_ARGS=()
if [ -n "$INIT" ]; then INIT_ARGS=(--init "$INIT"); fi
if [ -n "$DRAFT_VOCAB" ]; then INIT_ARGS+=(--draft-vocab "$DRAFT_VOCAB"); fi
$PY -m eagle.train.train --base default --data "$FEATURES/train,$FEATURES/heldout" --val-data "$FEATURES/heldout" \
    --val-data-exclusive --val-frac 1.0 --val-max-seqs 96 --max-len "$MAX_LEN" --out "$OUT" ${INIT_ARGS[@]+"${INIT_ARGS[@]}"} --unroll "$UNROLL" --eval-depths 5 \
    --w-tv "$ACC_WEIGHT" --max-minutes "$TRAIN_MINUTES" --epochs 50 --batch-tokens 2048 --lr 3e-4 --warmup 20 \
    --min-lr-ratio 0.1 --noise 0.1 --ce-frac 0.25 --clip 0.5 --eval-minutes 20 --save-minutes 10 --eval-at-start \
    --threads "$THREADS" "$@" 2>&1 | tee "${OUT%/}.train.log"

$PY -m research.heldout --heads "${INIT:+$INIT,}$OUT" --max-records 96 --threads "$THREADS" --json "${OUT%/}.heldout.json"
