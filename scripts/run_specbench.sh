#!/usr/bin/env bash
# Spec-Bench run: autoregressive baseline + verifiers over seeds, then metrics and the Table-1 layout.
#
# Usage: scripts/run_specbench.sh [MODEL] [TEMPERATURE] [options]
#   MODEL        "default" (embedded SmolLM2-135M-Instruct + our head; the default), a hub id or a folder
#   TEMPERATURE  sampling temperature (default 1.0)
# Options:
#   --head PATH            EAGLE head folder (needed for a non-default MODEL)
#   --tree T               mc_sim_7b_63 | KxD (e.g. 2x5, 3x3) | chainD   (default 2x5)
#   --seeds "0 1 2"        seeds (default "0 1 2")
#   --per-category N       N questions per category group (mt_bench: N in total, spread over its
#                          8 sub-categories); default: all 480 questions
#   --max-new-tokens N     per turn (default 256)
#   --methods "rrsw traversal greedy univer"   verifiers (the baseline "naive" always runs)
#   --question-file PATH   Spec-Bench question.jsonl (default data/spec_bench/question.jsonl, downloaded
#                          and sha256-checked if absent)
#   --out DIR              output folder (default runs/specbench/<model>-temp<T>-<tree>)
#   --threads N            CPU only: torch threads (default 1: on a shared CPU several threads spin against
#                          each other; 1 was 20x faster here). 0 = torch's default (a dedicated machine)
#   --quick                1 seed, 1 question per group (7 generations: mt_bench has 2 turns), 48 new
#                          tokens; options given after --quick win. Cost on 2 shared CPU cores (load ~6,
#                          1 thread, default model, tree 2x5): naive ~0.3 s/token, a tree step ~1.7 s,
#                          so ~2 min + 4 x (340/tau x 1.7 s) = about 18 min at tau 2.5 (a trained head),
#                          about 40 min with an untrained head (tau ~1)
# Device: CUDA when available (float16), else CPU (float32).
# Outputs: DIR/answers/*.jsonl, DIR/speed.json, DIR/table1.md/.json, DIR/table3.md/.json.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY="python"; fi

MODEL="default"
TEMP="1.0"
if [[ $# -gt 0 && "$1" != --* ]]; then MODEL="$1"; shift; fi
if [[ $# -gt 0 && "$1" != --* ]]; then TEMP="$1"; shift; fi

HEAD=""
TREE="2x5"
SEEDS="0 1 2"
PER_CAT=""
MAX_NEW=256
METHODS="rrsw traversal greedy univer"
QFILE=""
OUT=""
THREADS=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --head) HEAD="$2"; shift 2 ;;
    --tree) TREE="$2"; shift 2 ;;
    --seeds) SEEDS="$2"; shift 2 ;;
    --per-category) PER_CAT="$2"; shift 2 ;;
    --max-new-tokens) MAX_NEW="$2"; shift 2 ;;
    --methods) METHODS="$2"; shift 2 ;;
    --question-file) QFILE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --quick) SEEDS="0"; PER_CAT=1; MAX_NEW=48; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [[ -z "$OUT" ]]; then OUT="runs/specbench/$(basename "$MODEL")-temp${TEMP}-${TREE}"; fi
DEVICE="$("$PY" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')"
echo "== Spec-Bench: model=$MODEL temperature=$TEMP tree=$TREE seeds=[$SEEDS] per-category=${PER_CAT:-all}" \
     "max-new-tokens=$MAX_NEW device=$DEVICE out=$OUT"

ARGS=(--model "$MODEL" --temperature "$TEMP" --tree "$TREE" --max-new-tokens "$MAX_NEW"
      --out "$OUT/answers" --device "$DEVICE" --dtype auto)
[[ "$DEVICE" == "cpu" ]] && ARGS+=(--threads "$THREADS")
[[ -n "$HEAD" ]] && ARGS+=(--head "$HEAD")
[[ -n "$PER_CAT" ]] && ARGS+=(--per-category "$PER_CAT")
[[ -n "$QFILE" ]] && ARGS+=(--question-file "$QFILE")
# shellcheck disable=SC2206
SEED_ARR=($SEEDS)
# shellcheck disable=SC2206
METHOD_ARR=($METHODS)

START=$(date +%s)
"$PY" -m evaluation.gen_answer "${ARGS[@]}" --methods naive "${METHOD_ARR[@]}" --seeds "${SEED_ARR[@]}"
"$PY" -m evaluation.speed "$OUT/answers" --out "$OUT/speed.json"
"$PY" -m evaluation.tables "$OUT/speed.json" --temperature "$TEMP" --tree "$TREE" \
      --methods "${METHOD_ARR[@]}" --out-prefix "$OUT/table"
echo "== done in $(( $(date +%s) - START )) s; tables in $OUT/table1.md, metrics in $OUT/speed.json"
