#!/usr/bin/env bash
# Issue 20 phase diagram: `ablate --grid where-map` (plain / alpha 0.8 / alpha 0.6, 32 epochs, online eval every 4)
# per nuisance level and seed, in the order of queue.txt. Usage: run.sh WORKER NWORKERS [WAIT_PID...]
# (worker k takes every NWORKERS-th line; it first waits for the given processes to end).
# One thread per run, lowest priority, resumable: rerun the same line and finished variants are read
# back, a killed one continues from its last checkpoint (exact resume). PYTHONPATH pins the code to this
# checkout, so the runs can go on from a frozen copy (git worktree) while src/ is being edited.
set -u
cd "$(dirname "$0")/../../.."
worker=${1:-0}; nworkers=${2:-1}; shift 2 || true
for pid in "$@"; do while kill -0 "$pid" 2>/dev/null; do sleep 30; done; done
declare -A NUIS=([all]="[background,colour,scale,position]" [clean]="[]" [bg]="[background]"
                 [bg-colour]="[background,colour]" [bg-colour-scale]="[background,colour,scale]")
i=0
grep -v '^#' docs/results/where-map/queue.txt | while read -r level seed variants; do
  if [ $((i % nworkers)) -eq "$worker" ]; then
    PYTHONPATH=$PWD/src nice -n 19 .venv/bin/python -m resdecay ablate --grid where-map --only "$variants" \
      --out runs/where-map/$level/seed$seed "data.nuisances=${NUIS[$level]}" train.seed=$seed train.threads=1 --no-progress \
      || echo "FAILED $level seed $seed $variants"
  fi
  i=$((i + 1))
done
