#!/usr/bin/env bash
# Issue 20 phase diagram: nuisance level x seed, each an `ablate --grid where-map` of plain / alpha 0.8 / alpha 0.6
# (32 epochs, online eval every 4). Usage: run.sh WORKER NWORKERS  (worker k takes every NWORKERS-th cell).
# One thread per run, lowest priority, resumable: rerun the same line and finished variants are read
# back, a killed one continues from its last checkpoint (exact resume). PYTHONPATH pins the code to this
# checkout, so the runs can go on from a frozen copy (git worktree) while src/ is being edited.
set -u
cd "$(dirname "$0")/../../.."
worker=${1:-0}; nworkers=${2:-1}
levels=("all:[background,colour,scale,position]" "clean:[]" "bg:[background]" "bg-colour:[background,colour]"
        "bg-colour-scale:[background,colour,scale]")
i=0
for seed in 0 1 2; do
  for lv in "${levels[@]}"; do
    name=${lv%%:*}; nuis=${lv#*:}
    if [ $((i % nworkers)) -eq "$worker" ]; then
      PYTHONPATH=$PWD/src nice -n 19 .venv/bin/python -m resdecay ablate --grid where-map --out runs/where-map/$name/seed$seed \
        "data.nuisances=$nuis" train.seed=$seed train.threads=1 --no-progress || echo "FAILED $name seed $seed"
    fi
    i=$((i + 1))
  done
done
