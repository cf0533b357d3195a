#!/usr/bin/env bash
# RESULTS §19 (b): the decay × the representation aids of diffusion training — decay {off: sit-tiny-fmnist-plain,
# alpha_min 0.8 with skips: sit-tiny-fmnist} × train.aux {none, repa, dispersive} at toy SiT on Fashion-MNIST pixels
# (10,000 images, 4 epochs, batch 128), seeds 0-2, each ending with the online evaluation (proxy FID of 500 dopri5
# samples against the train split, the probe grid). REPA's frozen target is a plain MAE trained first on the same
# images (patch 4 on 28 px: the SiT's 7 x 7 token grid). Each queue item is one run; start two workers (one thread
# each), then collect:
#
#   docs/results/alternatives/grid_sit.sh & docs/results/alternatives/grid_sit.sh &     # workers
#   python docs/results/alternatives/collect_sit.py runs/alternatives/sit               # mean ± std table
#
# Usage: grid_sit.sh [--dry-run] [RUNS]   (RUNS default <repo>/runs/alternatives/sit)
#   SEEDS (default "0 1 2"), EPOCHS (4), SUBSET (10000), EVAL_SIZE (500), EXTRA (more key=value overrides);
#   ROOT, RESDECAY, DRY_RUN: docs/results/common.sh. Needs the Debian package dataset-fashion-mnist.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../common.sh" "$@"
RUNS=${ARGS[0]:-$ROOT/runs/alternatives/sit}
SEEDS=${SEEDS:-0 1 2}
EPOCHS=${EPOCHS:-4}
SUBSET=${SUBSET:-10000}
BUDGET=(data.train_subset=$SUBSET train.epochs=$EPOCHS train.online_eval_every=$EPOCHS
        train.online_eval_size=${EVAL_SIZE:-500} train.threads=1 train.ckpt_every=100000)
TARGET=$RUNS/target
# the target encoder: one worker trains it, the others wait for its summary
if claim "$RUNS/.claims" target; then
  # shellcheck disable=SC2086  # EXTRA: key=value words
  show nice -n 10 "$RESDECAY" pretrain --preset mae-tiny-fmnist-plain data.train_subset=$SUBSET train.epochs=$EPOCHS \
    train.threads=1 train.ckpt_every=100000 "train.out_dir=$TARGET" --no-progress
fi
[ "$DRY_RUN" = 1 ] || while [ ! -f "$TARGET/summary.json" ]; do sleep 20; done
TARGET_CKPT=$(find "$TARGET/checkpoints" -name 'step_*.pt' 2>/dev/null | sort | tail -1)
TARGET_CKPT=${TARGET_CKPT:-$TARGET/checkpoints/step_LAST.pt}  # (a dry run: not trained yet)
declare -A DECAY=([plain]=sit-tiny-fmnist-plain [decay0.8]=sit-tiny-fmnist)
# REPA's projector at the toy's scale: 256 wide for a 96-wide SiT (REPA's 2048 is for SiT-XL's 1152; at 2048 the
# projector's three matmuls on every token cost this toy ~10x its own step)
declare -A AUX=([none]="train.aux=none" [repa]="train.aux=repa train.aux_target=$TARGET_CKPT train.aux_proj_dim=256"
                [dispersive]="train.aux=dispersive")
for seed in $SEEDS; do
  for decay in plain decay0.8; do
    for aux in none repa dispersive; do
      if claim "$RUNS/.claims" "$decay-$aux-$seed"; then
        # shellcheck disable=SC2086  # AUX, EXTRA: key=value words
        show nice -n 10 "$RESDECAY" pretrain --preset "${DECAY[$decay]}" "${BUDGET[@]}" ${AUX[$aux]} "train.seed=$seed" \
          ${EXTRA:-} "train.out_dir=$RUNS/$decay-$aux/seed$seed" --no-progress || echo "FAILED $decay $aux seed $seed"
      fi
    done
  done
done
