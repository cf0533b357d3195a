#!/usr/bin/env bash
# Issue 40 item 7: the plain MAEs of the where-map (docs/results/where-map: where-small encoder, 32-epoch schedule,
# same data, seed and code), trained to step STOP of their 32-epoch run (default 300, ~3.8 epochs) and stopped
# there: the diagnostics of an early plain checkpoint are compared with the decay's measured gain at 32 epochs.
# The recipe is the where-map's (ablate's 'plain MAE' variant: the same preset and overrides; today's
# data.train_subset draws a class-balanced 20,000 where the where-map's runs took the first 20,000), killed once
# checkpoints/step_<STOP>.pt is written; one run at a time, one thread, lowest priority.
# Usage: train_plain.sh [RUNS] ; RUNS default runs/diagnostics-predict; levels x seeds 0 1.
set -u
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../../.." && pwd)
RUNS=${1:-$ROOT/runs/diagnostics-predict}; STOP=${STOP:-300}; PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
declare -A NUIS=([all]="[background,colour,scale,position]" [clean]="[]" [bg]="[background]"
                 [bg-colour]="[background,colour]" [bg-colour-scale]="[background,colour,scale]")
set -f
for seed in 0 1; do
  for level in clean bg bg-colour bg-colour-scale all; do
    out=$RUNS/$level/seed$seed; ckpt=$(printf "%s/checkpoints/step_%08d.pt" "$out" "$STOP")
    [ -f "$ckpt" ] && continue
    env PYTHONPATH="$ROOT/src" nice -n 19 "$PYTHON" -m resdecay pretrain --preset mae-tiny-fmnistm-plain --no-progress \
      --out "$out" --resume auto model.embed_dim=64 model.num_heads=4 model.decoder_embed_dim=64 model.decoder_num_heads=4 \
      model.patch_size=8 data.train_subset=20000 train.epochs=32 train.warmup_epochs=2 train.ckpt_every=100 \
      train.online_eval_every=4 train.online_eval_size=2000 "data.nuisances=${NUIS[$level]}" train.seed=$seed \
      train.threads=1 > "$RUNS/$level-seed$seed.log" 2>&1 &
    pid=$!
    while kill -0 $pid 2>/dev/null && [ ! -f "$ckpt" ]; do sleep 2; done
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    [ -f "$ckpt" ] && echo "$level seed $seed: $ckpt" || echo "FAILED $level seed $seed (see $RUNS/$level-seed$seed.log)"
  done
done
