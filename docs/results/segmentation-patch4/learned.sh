#!/usr/bin/env bash
# learned.sh LEVEL SEED: the faithful (learned) solver on the pair, timed
cd /work/main
out=/work/segruns/eval/$1/seed$2/learned
[ -f $out/a08/eval.json ] && exit 0
/usr/bin/time -v nice -n 3 .venv/bin/resdecay eval /work/segruns/$1/seed$2/plain/checkpoints/step_00000304.pt /work/segruns/$1/seed$2/a08/checkpoints/step_00000304.pt \
   --evals segmentation --seg-solver learned --seg-images 100 --no-progress --out $out > /work/segruns/eval-$1-$2-learned.log 2>&1
