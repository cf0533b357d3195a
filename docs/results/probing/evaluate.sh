#!/usr/bin/env bash
# Issue 50 item 7: every protocol on the where-map runs of queue.txt / queue-e32.txt (where-map/run.sh trained them
# into RUNS): kNN and the paper's probe beside the swept linear heads, the kNN sweep, EP and V-JEPA's attentive probe.
# Start one worker per core; each claims a run (mkdir RUNS/.eval-claims/...) and skips one already evaluated.
# One thread per evaluation, lowest priority.
#
# Usage: evaluate.sh [--dry-run]
#   RUNS  the runs (default <repo>/runs/probing): RUNS/<level>/seed<N>/<variant>/checkpoints/step_*.pt
#   OUT   the reports (default RUNS/eval): OUT/<level>/seed<N>/<variant>/eval.json
#   ROOT, RESDECAY, DRY_RUN: docs/results/common.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../common.sh" "$@"
RUNS=${RUNS:-$ROOT/runs/probing}
OUT=${OUT:-$RUNS/eval}
for run in "$RUNS"/*/seed*/*/; do
  run=${run%/}; [ -f "$run/summary.json" ] || continue  # a run still training has no summary yet
  ckpt=$(ls "$run"/checkpoints/step_*.pt | tail -n 1); variant=$(basename "$run"); seed=$(basename "$(dirname "$run")")
  level=$(basename "$(dirname "$(dirname "$run")")"); dest=$OUT/$level/$seed
  [ -f "$dest/$variant/eval.json" ] && continue
  claim "$RUNS/.eval-claims" "$level-$seed-$variant" || continue
  show env OMP_NUM_THREADS=1 nice -n 19 "$RESDECAY" eval "$ckpt" --evals knn,probe,linear_sweep,knn_sweep,ep,attentive \
    --max-train 20000 --max-test 5000 --no-baselines --no-progress --out "$dest" || echo "FAILED $ckpt"
done
