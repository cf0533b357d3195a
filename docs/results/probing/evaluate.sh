#!/usr/bin/env bash
# Issue 50 item 7: every protocol on the where-map runs of queue.txt (run.sh of where-map trained them into RUNS):
# kNN and the paper's probe beside the swept linear heads, the kNN sweep, EP and V-JEPA's attentive probe.
# Start one worker per core; each claims a checkpoint (mkdir RUNS/.eval-claims/...), skips one already evaluated.
#   RUNS  the runs (default <repo>/runs/probing): RUNS/<level>/seed<N>/<variant>/checkpoints/step_*.pt
#   OUT   reports (default RUNS/eval): OUT/<level>/seed<N>/<variant>/eval.json
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
RUNS=${RUNS:-$ROOT/runs/probing}
OUT=${OUT:-$RUNS/eval}
mkdir -p "$RUNS/.eval-claims"
for run in "$RUNS"/*/seed*/*/; do
  run=${run%/}; [ -f "$run/summary.json" ] || continue  # a run still training has no summary yet
  ckpt=$(ls "$run"/checkpoints/step_*.pt | tail -n 1); variant=$(basename "$run"); seed=$(basename "$(dirname "$run")")
  level=$(basename "$(dirname "$(dirname "$run")")"); dest=$OUT/$level/$seed
  [ -f "$dest/$variant/eval.json" ] && continue
  mkdir "$RUNS/.eval-claims/$level-$seed-$variant" 2>/dev/null || continue
  OMP_NUM_THREADS=1 nice -n 19 "$ROOT/.venv/bin/resdecay" eval "$ckpt" --evals knn,probe,linear_sweep,knn_sweep,ep,attentive \
    --max-train 20000 --max-test 5000 --no-baselines --no-progress --out "$dest" || echo "FAILED $ckpt"
done
