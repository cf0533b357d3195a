#!/usr/bin/env bash
# Worker: takes the next queue line not yet claimed; resumable (a finished run has summary.json).
cd /work/main
while pgrep -f "out /work/segruns/all/seed0" > /dev/null; do sleep 20; done
W="model.embed_dim=64 model.num_heads=4 model.decoder_embed_dim=64 model.decoder_num_heads=4 model.patch_size=4 data.train_subset=5000 train.epochs=16 train.warmup_epochs=2 train.threads=1 train.online_eval_every=0 train.ckpt_every=100"
while read level seed variant; do
  out=/work/segruns/$level/seed$seed/$variant
  mkdir -p /work/segruns/claims
  if ! mkdir /work/segruns/claims/$level-$seed-$variant 2>/dev/null; then continue; fi
  [ -f $out/summary.json ] && continue
  case $level in clean) N="data.nuisances=[]";; all) N="data.nuisances=[background,colour,scale,position]";; esac
  case $variant in plain) P="--preset mae-tiny-fmnistm-plain"; A="";; a08) P="--preset mae-tiny-fmnistm"; A="alpha_min=0.8";; esac
  nice -n 3 .venv/bin/resdecay pretrain $P --no-progress --out $out $W $N train.seed=$seed $A > /work/segruns/$level-$seed-$variant.log 2>&1
done < ${QUEUE:-/work/segruns/queue2.txt}
