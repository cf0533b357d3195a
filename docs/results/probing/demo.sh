#!/usr/bin/env bash
# Issue 50 item 7 on the demo's checkpoints: `resdecay demo` (plain MAE vs U-Net MAE, alpha_min 0.6; skipped when
# RUNS/demo-DATA holds a finished demo), then every protocol on both checkpoints, into RUNS/eval/demo-DATA/seed0/
# (plain/, decayed/), where collect.py reads them beside the where-map levels. One thread, lowest priority.
#
# Usage: demo.sh [--dry-run]
#   DATA  the demo's data set (default digits: the fresh machine's demo; fashion-mnist when its IDX files are there)
#   RUNS  the runs (default <repo>/runs/probing-demo)
#   ROOT, RESDECAY, DRY_RUN: docs/results/common.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../common.sh" "$@"
DATA=${DATA:-digits}
RUNS=${RUNS:-$ROOT/runs/probing-demo}
demo=$RUNS/demo-$DATA
[ -f "$demo/results.json" ] || show env OMP_NUM_THREADS=1 nice -n 19 "$RESDECAY" demo --data "$DATA" --out "$demo" \
  --no-progress --threads 1
limit=()
[ "$DATA" = digits ] || limit=(--max-train 20000 --max-test 5000)  # as evaluate.sh reads the where-map runs
show env OMP_NUM_THREADS=1 nice -n 19 "$RESDECAY" eval "$demo"/plain/checkpoints/step_*.pt "$demo"/decayed/checkpoints/step_*.pt \
  --evals knn,probe,linear_sweep,knn_sweep,ep,attentive ${limit[@]+"${limit[@]}"} --no-baselines --no-progress \
  --out "$RUNS/eval/demo-$DATA/seed0"
