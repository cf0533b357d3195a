#!/usr/bin/env bash
# Issue 20 phase diagram: `ablate --grid where-map` (plain / alpha 0.8 / alpha 0.6, 32 epochs, online eval every 4)
# per nuisance level and seed, in the order of the queue. Start one worker per core.
# Workers claim lines in order (claim in common.sh: mkdir RUNS/.claims/N), so two workers share the queue
# whatever the cost of each line; delete RUNS/.claims before restarting after the workers died.
# A level named LEVEL-eN (e.g. all-e64) trains N epochs instead of 32.
# One thread per run, lowest priority, resumable: rerun the same line and finished variants are read back,
# a killed one continues from its last checkpoint (exact resume). PYTHONPATH pins the code to this
# checkout, so the runs can go on from a frozen copy (git worktree) while src/ is being edited.
#
# Usage: run.sh [--dry-run] [WAIT_PID...]      (waits for those processes to end first)
#   RUNS    the runs' folder (default <repo>/runs/where-map): RUNS/<level>/seed<N>/
#   QUEUE   "level seed variants" lines (default queue.txt beside this script)
#   EXTRA   more key=value overrides for every run (a toy size, e.g. "train.epochs=1 data.train_subset=64")
#   ROOT, PYTHON, DRY_RUN: docs/results/common.sh
# --dry-run prints each ablate command instead of running it (no claims).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../common.sh" "$@"
set -- "${ARGS[@]}"
set -f  # the key=value words below hold [...]: never a file pattern
RUNS=${RUNS:-$ROOT/runs/where-map}
QUEUE=${QUEUE:-$HERE/queue.txt}
wait_for "$@"
declare -A NUIS=([all]="[background,colour,scale,position]" [clean]="[]" [bg]="[background]"
                 [bg-colour]="[background,colour]" [bg-colour-scale]="[background,colour,scale]")
i=0
grep -v '^#' "$QUEUE" | while read -r level seed variants; do
  [ -n "$level" ] || continue
  if claim "$RUNS/.claims" "$i"; then
    nuisances=${NUIS[${level%-e*}]}; epochs=32
    case $level in *-e*) epochs=${level##*-e};; esac
    # shellcheck disable=SC2086  # EXTRA: key=value words
    show env PYTHONPATH="$ROOT/src" nice -n 19 "$PYTHON" -m resdecay ablate --grid where-map --only "$variants" \
      --out "$RUNS/$level/seed$seed" "data.nuisances=$nuisances" train.epochs=$epochs \
      train.seed=$seed train.threads=1 ${EXTRA:-} --no-progress || echo "FAILED $level seed $seed $variants"
  fi
  i=$((i + 1))
done
