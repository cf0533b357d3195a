#!/usr/bin/env bash
# Issue 20, step 0: the small encoder's sign check at 16 epochs, seeds 0-2, plain vs alpha 0.8.
# One thread, lowest priority, resumable: rerun the same line and finished variants are read back,
# a killed one continues from its last checkpoint (--resume is the ablate runner's default).
#
# Usage: run.sh [--dry-run]
#   RUNS   the runs' folder (default <repo>/runs/where-small): RUNS/seed<N>/<variant>/
#   EXTRA  more key=value overrides for every run (a toy size, e.g. "train.epochs=1 data.train_subset=64")
#   ROOT, RESDECAY, DRY_RUN: docs/results/common.sh
# --dry-run prints each ablate command instead of running it.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../common.sh" "$@"
RUNS=${RUNS:-$ROOT/runs/where-small}
for seed in 0 1 2; do
  for v in "plain MAE" "alpha 0.8"; do
    # shellcheck disable=SC2086  # EXTRA: key=value words
    show nice -n 19 "$RESDECAY" ablate --grid where-small --only "$v" --out "$RUNS/seed$seed" \
      train.seed=$seed train.threads=1 ${EXTRA:-} --no-progress || echo "FAILED seed $seed $v"
  done
done
