#!/usr/bin/env bash
# tau of a draft head on the default model (issue 13's measurement): Spec-Bench, PER_CATEGORY questions per
# category group (default 5), MAX_NEW new tokens per turn (128), seed 0, over the FULL vocabulary
# (--draft-vocab off), for every (temperature, tree, method) asked; two one-thread processes share the
# category groups (mt_bench translation summarization | qa math_reasoning rag); evaluation.speed merges them.
#
#   research/head_tau.sh HEAD OUT [TEMPS] [TREES] [METHODS]     e.g. research/head_tau.sh runs/head-next runs/tau-next "0 1" "mc_sim_7b_63 2x5" "rrsw univer"
#
# Prints tau per group with the bootstrap standard error over questions; OUT/tau.json holds everything.
set -euo pipefail
HEAD=${1:?usage: research/head_tau.sh HEAD OUT [TEMPS] [TREES] [METHODS]}
OUT=${2:?usage: research/head_tau.sh HEAD OUT [TEMPS] [TREES] [METHODS]}
TEMPS=${3:-0}
TREES=${4:-mc_sim_7b_63}
METHODS=${5:-rrsw}
PER_CATEGORY=${PER_CATEGORY:-5}
MAX_NEW=${MAX_NEW:-128}
QUESTIONS=${QUESTIONS:-../shared/specbench/question.jsonl}
PY=${PYTHON:-python}
[ -f "$HEAD/config.json" ] || { echo "head_tau.sh: HEAD $HEAD has no config.json" >&2; exit 2; }
[ -f "$QUESTIONS" ] || { echo "head_tau.sh: QUESTIONS $QUESTIONS not found" >&2; exit 2; }
mkdir -p "$OUT"
half() {  # $1 = part name, rest = category groups
  local part=$1; shift
  for t in $TEMPS; do for tree in $TREES; do
    $PY -m evaluation.gen_answer --model default --head "$HEAD" --methods $METHODS --seeds 0 --temperature "$t" \
      --tree "$tree" --per-category "$PER_CATEGORY" --max-new-tokens "$MAX_NEW" --draft-vocab off --threads 1 \
      --contexts-per-question 0 --question-file "$QUESTIONS" --categories "$@" --no-plots --no-progress \
      --out "$OUT/$part-temp$t-$tree"
  done; done > "$OUT/$part.log" 2>&1
}
half a mt_bench translation summarization &
half b qa math_reasoning rag &
wait
$PY -m evaluation.speed "$OUT"/a-*/answers "$OUT"/b-*/answers --out "$OUT/tau.json" > /dev/null
$PY - "$OUT/tau.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
groups = d["groups"]
print("| method | T | tree | " + " | ".join(groups) + " | avg | questions |")
print("|---" * (len(groups) + 5) + "|")
for r in d["runs"]:
    s = r["per_seed"]["0"]
    cell = lambda g: f"{s[g]['tau']:.2f} ± {s[g]['tau_se']:.2f}" if s.get(g) and s[g].get("tau_se") is not None else f"{s[g]['tau']:.2f}"
    print(f"| {r['method']} | {r['temperature']:g} | {r['tree']} | " + " | ".join(cell(g) for g in groups)
          + f" | {cell('avg')} | {s['avg']['n_questions']} |")
PY
