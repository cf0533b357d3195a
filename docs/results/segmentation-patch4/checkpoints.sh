# Sourced by eval.sh and learned.sh: which checkpoints of a (plain, a08) pair they evaluate.
# checkpoint_of RUN: RUN/checkpoints/step_<STEP>.pt when STEP is set, else the newest step_*.pt; with --dry-run and
# no checkpoint yet, a placeholder name; else one line on stderr and status 1.
checkpoint_of() {
  local run=$1 found
  if [ -n "${STEP:-}" ]; then
    printf '%s/checkpoints/step_%08d.pt\n' "$run" "$STEP"
    return 0
  fi
  found=$(ls "$run"/checkpoints/step_*.pt 2>/dev/null | sort | tail -n 1)
  if [ -n "$found" ]; then echo "$found"; return 0; fi
  if [ "$DRY_RUN" = 1 ]; then echo "$run/checkpoints/step_NEWEST.pt"; return 0; fi
  echo "no checkpoint in $run/checkpoints: train the pair first (docs/results/segmentation-patch4/run.sh)" >&2
  return 1
}

# pair_checkpoints SCRIPT LEVEL SEED: the arguments of eval.sh and learned.sh. Sets level, seed, RUNS (default
# <repo>/runs/segmentation-patch4) and plain, a08: checkpoint_of RUNS/LEVEL/seedSEED/{plain,a08}. Exits the script
# with a usage line and status 2 unless given LEVEL SEED, with status 1 when a run has no checkpoint.
pair_checkpoints() {
  local script=$1; shift
  if [ $# -ne 2 ]; then echo "usage: $script [--dry-run] LEVEL SEED   (e.g. $script all 0)" >&2; exit 2; fi
  level=$1 seed=$2
  RUNS=${RUNS:-$ROOT/runs/segmentation-patch4}
  plain=$(checkpoint_of "$RUNS/$level/seed$seed/plain") || exit 1
  a08=$(checkpoint_of "$RUNS/$level/seed$seed/a08") || exit 1
}
