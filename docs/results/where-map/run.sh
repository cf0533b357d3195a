#!/usr/bin/env bash
# Issue 20 phase diagram: `ablate --grid where-map` (plain / alpha 0.8 / alpha 0.6, 32 epochs, online eval every 4)
# per nuisance level and seed, in the order of queue.txt. Usage: run.sh [WAIT_PID...]; start one per core.
# Workers claim lines in order (mkdir runs/where-map/.claims/N is atomic), so two workers share the queue
# whatever the cost of each line; delete .claims before restarting after the workers died.
# A level named LEVEL-eN (e.g. all-e64) trains N epochs instead of 32.
# One thread per run, lowest priority, resumable: rerun the same line and finished variants are read
# back, a killed one continues from its last checkpoint (exact resume). PYTHONPATH pins the code to this
# checkout, so the runs can go on from a frozen copy (git worktree) while src/ is being edited.
set -u
cd "$(dirname "$0")/../../.."
for pid in "$@"; do while kill -0 "$pid" 2>/dev/null; do sleep 30; done; done
declare -A NUIS=([all]="[background,colour,scale,position]" [clean]="[]" [bg]="[background]"
                 [bg-colour]="[background,colour]" [bg-colour-scale]="[background,colour,scale]")
i=0
grep -v '^#' docs/results/where-map/queue.txt | while read -r level seed variants; do
  mkdir -p runs/where-map/.claims
  if mkdir "runs/where-map/.claims/$i" 2>/dev/null; then
    nuisances=${NUIS[${level%-e*}]}; epochs=32
    case $level in *-e*) epochs=${level##*-e};; esac
    PYTHONPATH=$PWD/src nice -n 19 .venv/bin/python -m resdecay ablate --grid where-map --only "$variants" \
      --out runs/where-map/$level/seed$seed "data.nuisances=$nuisances" train.epochs=$epochs \
      train.seed=$seed train.threads=1 --no-progress || echo "FAILED $level seed $seed $variants"
  fi
  i=$((i + 1))
done
