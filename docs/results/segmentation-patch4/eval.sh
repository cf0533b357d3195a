#!/usr/bin/env bash
# eval.sh LEVEL SEED: RESULTS §15's evaluation of one (plain, a08) pair that run.sh trained: segmentation of
# SEG_IMAGES class-balanced test images with each solver under each evaluation seed (--seg-seed), then kNN and
# the linear probe of the same checkpoints. Resumable: a finished output (its a08/eval.json) is skipped.
#
# Usage: eval.sh [--dry-run] LEVEL SEED
#   RUNS        run folders, as run.sh (default <repo>/runs/segmentation-patch4); the checkpoints are
#               RUNS/LEVEL/seedSEED/{plain,a08}/checkpoints/step_*.pt (the newest, or step STEP when STEP=N is set)
#   SEG_SEEDS   evaluation seeds, each passed as --seg-seed (default "0"; e.g. SEG_SEEDS="0 1 2")
#   SOLVERS     segmentation solvers (default "exact kmeans"; learned.sh runs the learned one)
#   SEG_IMAGES  segmentation images (default 100)
#   KNN_PROBE   1 (default): also --evals knn,probe once per pair (they do not depend on the seg seed); 0: not
#   ROOT, RESDECAY, DRY_RUN: docs/results/common.sh
# Writes RUNS/eval/LEVEL/seedSEED/<solver>/segseed<E>/{plain,a08}/eval.json and
# RUNS/eval/LEVEL/seedSEED/knn-probe/{plain,a08}/eval.json (collect.py reads them), logs in RUNS/logs/.
# --dry-run prints each evaluation command instead of running it.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../common.sh" "$@"
source "$HERE/checkpoints.sh"
pair_checkpoints eval.sh "${ARGS[@]}"  # sets level, seed, RUNS, plain, a08

for solver in ${SOLVERS:-exact kmeans}; do
  for e in ${SEG_SEEDS:-0}; do
    out=$RUNS/eval/$level/seed$seed/$solver/segseed$e
    [ -f "$out/a08/eval.json" ] && continue
    logged "$RUNS/logs/eval-$level-$seed-$solver-segseed$e.log" nice -n 3 "$RESDECAY" eval "$plain" "$a08" \
      --evals segmentation --seg-solver "$solver" --seg-seed "$e" --seg-images "${SEG_IMAGES:-100}" --no-progress \
      --out "$out" || echo "FAILED $level seed $seed $solver seg seed $e"
  done
done
if [ "${KNN_PROBE:-1}" = 1 ]; then
  out=$RUNS/eval/$level/seed$seed/knn-probe
  if [ ! -f "$out/a08/eval.json" ]; then
    logged "$RUNS/logs/eval-$level-$seed-knn-probe.log" nice -n 3 "$RESDECAY" eval "$plain" "$a08" \
      --evals knn,probe --no-progress --out "$out" || echo "FAILED $level seed $seed knn,probe"
  fi
fi
