#!/usr/bin/env bash
# RESULTS §12's seed runs of the demo: digits seeds 1 and 2, Fashion-MNIST seeds 0-2 (2 threads), and Fashion-MNIST
# seed 0 on 1 thread. summarise.py reads their results.json (copied beside it as <name>.json).
#
# Usage: run_seeds.sh [--dry-run]
#   RUNS  the demo runs' folder (default <repo>/runs/repro): RUNS/<name>/ and RUNS/<name>.log
#   ROOT, RESDECAY, DRY_RUN: docs/results/common.sh
# --dry-run prints each demo command instead of running it.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../common.sh" "$@"
RUNS=${RUNS:-$ROOT/runs/repro}
demo() {  # demo NAME THREADS ARGS...
  local name=$1 threads=$2; shift 2
  logged "$RUNS/$name.log" env OMP_NUM_THREADS="$threads" "$RESDECAY" demo "$@" --no-progress --out "$RUNS/$name" \
    || echo "FAILED $name (log: $RUNS/$name.log)"
}
for s in 1 2; do demo "digits_t2_seed$s" 2 --data digits --seed "$s"; done
for s in 0 1 2; do demo "fmnist_t2_seed$s" 2 --data fashion-mnist --seed "$s"; done
demo fmnist_t1_seed0 1 --data fashion-mnist --seed 0
