#!/usr/bin/env bash
# RESULTS §18: the orthogonal residual update beside the plain MAE and the decay, at the demo's Fashion-MNIST budget
# (96 wide, 20,000 training images, 4 epochs, seed 0, one thread each), then kNN and effective rank on the last block
# (60,000 train bank -> 10,000 test). Needs the Debian package dataset-fashion-mnist. About 7 minutes per run on one
# core, then ~4 minutes per evaluation.
#
# Usage: orthogonal_fmnist.sh [--dry-run] [RUNS]   (RUNS default <repo>/runs/alternatives)
#   EXTRA (more key=value overrides, e.g. a toy size), STEPS (the last step, 312 at this budget);
#   ROOT, RESDECAY, DRY_RUN: docs/results/common.sh
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../common.sh" "$@"
set -- "${ARGS[@]}"
RUNS=${1:-$ROOT/runs/alternatives}
# shellcheck disable=SC2206  # key=value words
COMMON=(model.embed_dim=96 model.decoder_embed_dim=64 data.train_subset=20000 train.epochs=4 train.warmup_epochs=1
        train.seed=0 train.ckpt_every=100000 train.threads=1 ${EXTRA:-})
declare -A VARIANT=([plain]="mae-tiny-fmnist-plain" [decay]="mae-tiny-fmnist model.alpha_min=0.6"
                    [orthogonal]="mae-tiny-fmnist-plain model.shortcut=orthogonal"
                    [orthogonal-decay]="mae-tiny-fmnist model.shortcut=orthogonal_decay model.alpha_min=0.6")
for run in plain decay orthogonal orthogonal-decay; do
  read -r preset own <<< "${VARIANT[$run]} "
  # shellcheck disable=SC2086  # own: key=value words
  show "$RESDECAY" pretrain --preset "$preset" "${COMMON[@]}" $own "train.out_dir=$RUNS/$run" --no-progress
done
STEPS=${STEPS:-312}  # 78 steps per epoch x 4 epochs: the checkpoint each run ends with
for run in plain decay orthogonal orthogonal-decay; do
  show "$RESDECAY" eval "$(printf "%s/checkpoints/step_%08d.pt" "$RUNS/$run" "$STEPS")" --evals knn,rank \
      --out "$RUNS/eval" --no-progress
done
