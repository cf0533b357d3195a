#!/usr/bin/env bash
# Issue 52 item 6, for a session lent a GPU: RESULTS §19 (b)'s 2 x 3 table — decay {off: sit-tiny-fmnist-plain,
# alpha_min 0.8 with skips: sit-tiny-fmnist} x train.aux {none, repa, dispersive} — at SiT-S/2 size (384 wide x 12
# blocks, 6 heads, patch 2: 14 x 14 tokens on 28 px) on all 60,000 Fashion-MNIST training images, batch 256, each run
# ending with §19 (b)'s online evaluation (proxy FID of EVAL_SIZE dopri5 samples, the probe grid). REPA's frozen
# target is a plain tiny MAE (mae-tiny-fmnist-plain at patch 2: the SiT's 14 x 14 token grid; at its own patch 4 its
# 7 x 7 tokens are coarser, which REPA's resampling refuses) trained first on the same images, and its projector is REPA's own width (2048). Sized for one 9-minute command on an H100 by
# estimate only (never run on one): the runs go in (plain, decayed) pairs, aux none first, and no run starts once
# the time spent plus the last run's length passes BUDGET_S (default 480 s), so a short budget leaves whole pairs and
# says which were not started. A finished run (its summary.json) is kept and a stopped one resumed: run the script
# again to go on. Then
# collect_sit.py writes OUT/table/sit_grid.{json,md} (one seed: no spread).
#
#   bash docs/results/alternatives/gpu_sit_s2.sh [--dry-run] [OUT]    # default OUT: <repo>/runs/alternatives/sit-s2
#
# On the GPU machine install first with its own PyTorch: pip install --no-deps -e .  Fashion-MNIST is read from FMNIST
# (default Debian's /usr/share/datasets/fashion-mnist); for a machine without the package, copy its four IDX files into
# the repository (mkdir -p data && cp -r /usr/share/datasets/fashion-mnist data/), carry "data/fashion-mnist" and set
# FMNIST=data/fashion-mnist. Knobs: SEEDS ("0"), EPOCHS (2), SUBSET (60000), BATCH (256), EVAL_SIZE (500),
# BUDGET_S (480), EXTRA / TARGET_EXTRA (more key=value overrides of the SiT runs / of the target MAE); ROOT, RESDECAY,
# PYTHON, DRY_RUN: ../common.sh. On a CPU, a toy that checks the script end to end (RESULTS §19 (b), item 6):
#   SUBSET=256 EPOCHS=1 BATCH=32 EVAL_SIZE=130 EXTRA="model.embed_dim=32 model.depth=2 model.num_heads=2
#   train.aux_proj_dim=32" TARGET_EXTRA="model.depth=2 model.decoder_depth=1" gpu_sit_s2.sh runs/sit-s2-toy
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../common.sh" "$@"
OUT=${ARGS[0]:-$ROOT/runs/alternatives/sit-s2}
for knob in EPOCHS BUDGET_S SUBSET BATCH EVAL_SIZE; do
  if [ -n "${!knob:-}" ] && ! [[ "${!knob}" =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu_sit_s2.sh: error: $knob=${!knob} is not a positive whole number; give one (e.g. $knob=2) or leave it unset" >&2
    exit 2
  fi
done
FMNIST=${FMNIST:-/usr/share/datasets/fashion-mnist}
if [ "$DRY_RUN" != 1 ] && [ ! -f "$FMNIST/train-images-idx3-ubyte.gz" ] && [ ! -f "$FMNIST/train-images-idx3-ubyte" ]; then
  echo "gpu_sit_s2.sh: error: no Fashion-MNIST IDX files in $FMNIST; install dataset-fashion-mnist or set FMNIST=DIR" >&2
  exit 2
fi
SEEDS=${SEEDS:-0}
EPOCHS=${EPOCHS:-2}
BUDGET_S=${BUDGET_S:-480}
DATA=("data.path=$FMNIST" "data.train_subset=${SUBSET:-60000}" "train.epochs=$EPOCHS")
SIT_S2=(model.embed_dim=384 model.depth=12 model.num_heads=6 model.patch_size=2 "train.batch_size=${BATCH:-256}")
EVAL=(train.online_eval_every="$EPOCHS" train.online_eval_size="${EVAL_SIZE:-500}" train.ckpt_every=100000)
TARGET=$OUT/target
set -f  # the key=value words hold [...]: never a file pattern

START=$SECONDS
LAST=0
# run NAME CMD...: CMD unless NAME's summary.json exists or the budget is spent; LAST = its seconds
run() {
  local folder=$1 began=$SECONDS; shift
  if [ -f "$folder/summary.json" ]; then echo "kept: $folder (finished)"; return 0; fi
  if [ "$DRY_RUN" != 1 ] && [ $((SECONDS - START + LAST)) -gt "$BUDGET_S" ]; then
    echo "not started (BUDGET_S $BUDGET_S s: $((SECONDS - START)) s spent, the last run took $LAST s): $folder"
    return 0
  fi
  show "$@" || echo "FAILED: $folder"
  LAST=$((SECONDS - began))
  [ "$DRY_RUN" = 1 ] || echo "$folder: $LAST s"
}

# shellcheck disable=SC2086  # TARGET_EXTRA: key=value words
run "$TARGET" "$RESDECAY" pretrain --preset mae-tiny-fmnist-plain "${DATA[@]}" model.patch_size=2 train.ckpt_every=100000 \
  ${TARGET_EXTRA:-} "train.out_dir=$TARGET" --resume auto --no-progress
TARGET_CKPT=$(set +f; ls "$TARGET"/checkpoints/step_*.pt 2>/dev/null | tail -1)
TARGET_CKPT=${TARGET_CKPT:-$TARGET/checkpoints/step_LAST.pt}  # (a dry run: not trained yet)
declare -A DECAY=([plain]=sit-tiny-fmnist-plain [decay0.8]=sit-tiny-fmnist)
declare -A AUX=([none]="train.aux=none" [repa]="train.aux=repa train.aux_target=$TARGET_CKPT"
                [dispersive]="train.aux=dispersive")
for seed in $SEEDS; do
  for aux in none repa dispersive; do
    for decay in plain decay0.8; do
      folder=$OUT/$decay-$aux/seed$seed
      # shellcheck disable=SC2086  # AUX, EXTRA: key=value words
      run "$folder" "$RESDECAY" pretrain --preset "${DECAY[$decay]}" "${DATA[@]}" "${SIT_S2[@]}" "${EVAL[@]}" \
        ${AUX[$aux]} "train.seed=$seed" ${EXTRA:-} "train.out_dir=$folder" --resume auto --no-progress
    done
  done
done
show "$PYTHON" "$HERE/collect_sit.py" "$OUT" --out "$OUT/table"
