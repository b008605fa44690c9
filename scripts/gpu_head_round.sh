#!/usr/bin/env bash
# One GPU round of draft-head training for the default model: the recipe that made stage 8 on one H200
# (2026-12-04; ~8 min of GPU time with the four-arm search it came from; head README, "Stage 8: the GPU round").
#
#   bash scripts/gpu_head_round.sh OUT [INIT]     # OUT: new head folder; INIT: head to start from (default: shipped)
#
# 1. target features of the whole committed corpus (data/distill), NF processes sharing the GPU (a 135M
#    target is launch-bound: ~5k tokens/s per process on an H200, 8 processes ~1.5 min for 3.5M tokens);
# 2. phase 1 from INIT: unroll 4 (training-time test), CE on every position (w_ce 0.1), acceptance loss
#    1 - sum min(p, q) (w_tv 0.5), lr 3e-4, 1487 steps of 8192 tokens (~2 epochs);
# 3. phase 2 from phase 1: lr 2e-4, seed 1, 814 steps (~1.1 epochs);
# 4. held-out top-1 / top-4 per depth 1..5 of INIT, phase 1 and OUT on the first 96 held-out records.
# Needs a CUDA GPU (DEV=cpu runs it on the CPU, for days), torch, transformers and the default model's
# package (scripts/install.sh). Scratch files go to WORK (default cache/gpu-round, outside git).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/gpu_head_round.sh OUT [INIT]}
INIT=${2:-data/heads/smollm2-135m-eagle}
PY=${PYTHON:-python}; DEV=${DEV:-cuda}; NF=${NF:-8}; WORK=${WORK:-cache/gpu-round}
STEPS1=${STEPS1:-1487}; STEPS2=${STEPS2:-814}; HR=${HR:-96}; SHARDS=${SHARDS:-}  # SHARDS e.g. 0,39: a rehearsal
[ -f "$INIT/config.json" ] || { echo "gpu_head_round.sh: INIT $INIT has no config.json" >&2; exit 2; }
[ "$DEV" = cpu ] || "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || { echo "gpu_head_round.sh: no CUDA device (DEV=cpu to run on the CPU)" >&2; exit 2; }
mkdir -p "$WORK"
pids=""
for i in $(seq 0 $((NF - 1))); do
  "$PY" -m eagle.train.features --corpus data/distill --out "$WORK/feat" --device "$DEV" --threads 2 \
    --batch-tokens 32768 --worker "$i/$NF" ${SHARDS:+--shards "$SHARDS"} > "$WORK/features_$i.log" 2>&1 &
  pids="$pids $!"
done
for p in $pids; do wait "$p" || { echo "gpu_head_round.sh: a features worker failed (see $WORK/features_*.log)" >&2; exit 1; }; done
COMMON=(--base default --data "$WORK/feat/train,$WORK/feat/heldout" --val-data "$WORK/feat/heldout" --val-data-exclusive
        --draft-vocab data/heads/smollm2-135m-eagle --max-len 768 --batch-tokens 8192 --min-lr-ratio 0.1 --noise 0.1
        --clip 0.5 --val-frac 1.0 --val-max-seqs 96 --eval-depths 5 --eval-minutes 5 --save-minutes 5 --threads 4
        --device "$DEV" --unroll 4 --w-ce 0.1 --ce-frac 1.0 --w-tv 0.5)
"$PY" -m eagle.train.train "${COMMON[@]}" --init "$INIT" --out "$WORK/phase1" --lr 3e-4 --warmup 20 --seed 0 \
  --max-steps "$STEPS1"
"$PY" -m eagle.train.train "${COMMON[@]}" --init "$WORK/phase1" --out "$OUT" --lr 2e-4 --warmup 10 --seed 1 \
  --max-steps "$STEPS2"
"$PY" -m eagle.train.heldout --heads "$INIT,$WORK/phase1,$OUT" --max-records "$HR" --device "$DEV" --threads 8 \
  --json "$OUT/heldout_round.json"
