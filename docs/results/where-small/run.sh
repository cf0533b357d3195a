#!/usr/bin/env bash
# Issue 20, step 0: the small encoder's sign check at 16 epochs, seeds 0-2, plain vs alpha 0.8.
# One thread, lowest priority, resumable: rerun the same line and finished variants are read back,
# a killed one continues from its last checkpoint (--resume is the ablate runner's default).
set -u
cd "$(dirname "$0")/../../.."
for seed in 0 1 2; do
  for v in "plain MAE" "alpha 0.8"; do
    nice -n 19 .venv/bin/resdecay ablate --grid where-small --only "$v" --out runs/where-small/seed$seed \
      train.seed=$seed train.threads=1 --no-progress || echo "FAILED seed $seed $v"
  done
done
