#!/usr/bin/env bash
# eval.sh LEVEL SEED: exact and kmeans segmentation of the pair, 100 class-balanced test images
cd /work/main
for solver in exact kmeans; do
  out=/work/segruns/eval/$1/seed$2/$solver
  [ -f $out/a08/eval.json ] && continue
  nice -n 3 .venv/bin/resdecay eval /work/segruns/$1/seed$2/plain/checkpoints/step_00000304.pt /work/segruns/$1/seed$2/a08/checkpoints/step_00000304.pt \
     --evals segmentation --seg-solver $solver --seg-images 100 --no-progress --out $out > /work/segruns/eval-$1-$2-$solver.log 2>&1
done
