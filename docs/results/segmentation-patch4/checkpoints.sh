# Sourced by eval.sh and learned.sh: which checkpoint of a run they evaluate.
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
