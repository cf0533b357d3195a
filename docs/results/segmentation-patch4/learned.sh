#!/usr/bin/env bash
# learned.sh LEVEL SEED: the faithful (learned) segmentation solver on one (plain, a08) pair, timed
# (/usr/bin/time -v when it is installed). About 22 minutes per pair on 2 CPU cores at 100 images.
#
# Usage: learned.sh [--dry-run] LEVEL SEED
#   RUNS, STEP, SEG_SEEDS, SEG_IMAGES: as eval.sh (default RUNS <repo>/runs/segmentation-patch4, SEG_SEEDS "0")
#   ROOT, RESDECAY, DRY_RUN: docs/results/common.sh
# Writes RUNS/eval/LEVEL/seedSEED/learned/segseed<E>/{plain,a08}/eval.json, logs in RUNS/logs/.
# --dry-run prints each evaluation command instead of running it.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../common.sh" "$@"
source "$HERE/checkpoints.sh"
pair_checkpoints learned.sh "${ARGS[@]}"  # sets level, seed, RUNS, plain, a08
TIME=()
[ -x /usr/bin/time ] && TIME=(/usr/bin/time -v)
for e in ${SEG_SEEDS:-0}; do
  out=$RUNS/eval/$level/seed$seed/learned/segseed$e
  [ -f "$out/a08/eval.json" ] && continue
  logged "$RUNS/logs/eval-$level-$seed-learned-segseed$e.log" "${TIME[@]}" nice -n 3 "$RESDECAY" eval "$plain" "$a08" \
    --evals segmentation --seg-solver learned --seg-seed "$e" --seg-images "${SEG_IMAGES:-100}" --no-progress \
    --out "$out" || echo "FAILED $level seed $seed learned seg seed $e"
done
