#!/usr/bin/env bash
# The plain MAEs of the where-map recipe (docs/results/where-map: where-small encoder, 32-epoch
# schedule, the level's data, seed), each trained to step STEP of its 32-epoch run (default 300, ~3.8 epochs) and
# stopped there: predict.py compares the diagnostics of these early plain checkpoints with the decay's gain the
# where-map measured at 32 epochs. The recipe is ablate's 'plain MAE' variant of the where-map grid (today's
# data.train_subset draws a class-balanced 20,000 where the where-map's runs took the first 20,000); each run is
# killed once checkpoints/step_<STEP>.pt is written; one run at a time, one thread, lowest priority; a finished
# run is skipped, so the script can be rerun after an interruption.
#
# Usage: train_plain.sh [--dry-run] [RUNS]     (RUNS default <repo>/runs/diagnostics-predict: RUNS/<level>/seed<N>/)
#   STEP, LEVELS (default: the five), SEEDS (default "0 1"), EXTRA (more key=value overrides, e.g. a toy size);
#   ROOT, PYTHON, DRY_RUN: docs/results/common.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../common.sh" "$@"
set -- "${ARGS[@]}"
RUNS=${1:-$ROOT/runs/diagnostics-predict}; STEP=${STEP:-300}
LEVELS=${LEVELS:-"clean bg bg-colour bg-colour-scale all"}; SEEDS=${SEEDS:-"0 1"}
declare -A NUIS=([all]="[background,colour,scale,position]" [clean]="[]" [bg]="[background]"
                 [bg-colour]="[background,colour]" [bg-colour-scale]="[background,colour,scale]")
set -f  # the key=value words hold [...]: never a file pattern
for seed in $SEEDS; do
  for level in $LEVELS; do
    out=$RUNS/$level/seed$seed; ckpt=$(printf "%s/checkpoints/step_%08d.pt" "$out" "$STEP")
    [ -f "$ckpt" ] && continue
    # shellcheck disable=SC2086  # EXTRA: key=value words
    cmd=(env PYTHONPATH="$ROOT/src" nice -n 19 "$PYTHON" -m resdecay pretrain --preset mae-tiny-fmnistm-plain --no-progress
         --out "$out" --resume auto model.embed_dim=64 model.num_heads=4 model.decoder_embed_dim=64
         model.decoder_num_heads=4 model.patch_size=8 data.train_subset=20000 train.epochs=32 train.warmup_epochs=2
         train.ckpt_every=100 train.online_eval_every=4 train.online_eval_size=2000 "data.nuisances=${NUIS[$level]}"
         train.seed=$seed train.threads=1 ${EXTRA:-})
    if [ "$DRY_RUN" = 1 ]; then show "${cmd[@]}"; continue; fi
    mkdir -p "$RUNS"
    "${cmd[@]}" > "$RUNS/$level-seed$seed.log" 2>&1 &
    pid=$!
    while kill -0 $pid 2>/dev/null && [ ! -f "$ckpt" ]; do sleep 2; done
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    if [ -f "$ckpt" ]; then echo "$level seed $seed: $ckpt"; else echo "FAILED $level seed $seed (see $RUNS/$level-seed$seed.log)"; fi
  done
done
