#!/usr/bin/env bash
# RESULTS §15's pretraining runs. A worker takes the next "level seed variant" line of the queue that no other
# worker has claimed (mkdir RUNS/claims/<line> is atomic), so several workers share one queue; start one per core.
# Resumable: a finished run (summary.json) is skipped, a killed one continues from its last checkpoint
# (--resume auto); delete RUNS/claims before restarting after the workers died.
#
# Usage: run.sh [--dry-run] [WAIT_PID...]      (waits for those processes to end first)
#   RUNS    run folders (default <repo>/runs/segmentation-patch4): RUNS/<level>/seed<N>/<plain|a08>/, logs in RUNS/logs/
#   QUEUE   a file of "level seed variant" lines, level clean|all, variant plain|a08 (default RUNS/queue.txt if it
#           exists, else both levels x seeds 0 1 2 x both variants)
#   EXTRA   more key=value overrides for every run (a toy size, e.g. "train.epochs=1 data.train_subset=64")
#   ROOT, RESDECAY, DRY_RUN: docs/results/common.sh
# --dry-run prints each training command instead of running it (no claims, no folders).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../common.sh" "$@"
set -- "${ARGS[@]}"
set -f  # the key=value words below hold [...]: never a file pattern
RUNS=${RUNS:-$ROOT/runs/segmentation-patch4}
QUEUE=${QUEUE:-$RUNS/queue.txt}
wait_for "$@"
W="model.embed_dim=64 model.num_heads=4 model.decoder_embed_dim=64 model.decoder_num_heads=4 model.patch_size=4 data.train_subset=5000 train.epochs=16 train.warmup_epochs=2 train.threads=1 train.online_eval_every=0 train.ckpt_every=100"

queue() {
  if [ -f "$QUEUE" ]; then grep -v '^#' "$QUEUE"; return; fi
  for level in clean all; do for seed in 0 1 2; do for variant in plain a08; do echo "$level $seed $variant"; done; done; done
}

queue | while read -r level seed variant; do
  [ -n "$level" ] || continue
  out=$RUNS/$level/seed$seed/$variant
  claim "$RUNS/claims" "$level-$seed-$variant" || continue
  [ "$DRY_RUN" != 1 ] && [ -f "$out/summary.json" ] && continue
  case $level in
    clean) N="data.nuisances=[]";;
    all) N="data.nuisances=[background,colour,scale,position]";;
    *) echo "unknown level $level (clean or all)" >&2; continue;;
  esac
  case $variant in
    plain) P=mae-tiny-fmnistm-plain; A="";;
    a08) P=mae-tiny-fmnistm; A="alpha_min=0.8";;
    *) echo "unknown variant $variant (plain or a08)" >&2; continue;;
  esac
  # shellcheck disable=SC2086  # W, N, A and EXTRA are lists of key=value words
  logged "$RUNS/logs/$level-$seed-$variant.log" nice -n 3 "$RESDECAY" pretrain --preset $P --no-progress --resume auto \
    --out "$out" $W $N train.seed=$seed $A ${EXTRA:-} || echo "FAILED $level seed $seed $variant (log: $RUNS/logs/$level-$seed-$variant.log)"
done
