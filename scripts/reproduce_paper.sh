#!/usr/bin/env bash
# The paper in one command (issue 51): Tables 1 and 3 and Figure 4 on the embedded default model, the paper's
# numbers beside ours, a verdict per cell; the same sweep for the GPU settings, one process per GPU.
#
#   bash scripts/reproduce_paper.sh --quick                  # smoke run, CPU: ~8 min on 2 idle cores (16 CPU-min) -> runs/reproduce-quick/default-cpu/report.md
#   bash scripts/reproduce_paper.sh --dry-run                # cells, units, cost estimate; offline, seconds
#   bash scripts/reproduce_paper.sh                          # the full CPU run (dry-run estimate ~2 h on 2 idle cores; allow 3) -> runs/reproduce/default-cpu/report.md
#   bash scripts/reproduce_paper.sh configs/paper/vicuna-7b.json              # GPU: one process per visible GPU
#   accelerate launch --num_processes 8 -m evaluation.reproduce configs/paper/vicuna-7b.json   # same, via accelerate
#   python -m evaluation.reproduce configs/paper/vicuna-7b.json --merge      # ... then the report (accelerate path)
#
# Any run is resumable: rerun the same command and finished units are skipped. Other options are passed to
# python -m evaluation.reproduce (--out DIR, --shard i/n, --merge DIR..., --no-plots; see its --help).
# Environment: JOBS = parallel processes (default: the number of GPUs, else 2 on the CPU, one thread each).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
CONFIGS=() ARGS=() DRY=0
for a in "$@"; do
  case "$a" in
    *.json) CONFIGS+=("$a") ;;
    --dry-run) DRY=1; ARGS+=("$a") ;;
    *) ARGS+=("$a") ;;
  esac
done
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(configs/paper/default-cpu.json)
GPUS=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
JOBS=${JOBS:-$([ "$GPUS" -gt 0 ] && echo "$GPUS" || echo 2)}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if [ "$DRY" = 1 ]; then
  exec $PY -m evaluation.reproduce "${CONFIGS[@]}" "${ARGS[@]}" --processes "$JOBS"
fi
$PY -m evaluation.reproduce "${CONFIGS[@]}" "${ARGS[@]}" --dry-run --processes "$JOBS"
start=$(date +%s)
pids=()
for ((i = 0; i < JOBS; i++)); do
  if [ "$GPUS" -gt 0 ]; then export CUDA_VISIBLE_DEVICES=$i; fi
  $PY -m evaluation.reproduce "${CONFIGS[@]}" "${ARGS[@]}" --shard "$i/$JOBS" > >(sed -u "s/^/[shard $i] /") 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
unset CUDA_VISIBLE_DEVICES
[ "$rc" = 0 ] || { echo "reproduce_paper.sh: a shard failed (exit $rc); rerun the same command to resume" >&2; exit "$rc"; }
$PY -m evaluation.reproduce "${CONFIGS[@]}" "${ARGS[@]}" --merge
echo "reproduce_paper.sh: done in $(( $(date +%s) - start )) s"
