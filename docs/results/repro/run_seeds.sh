#!/usr/bin/env bash
cd /work/main
for s in 1 2; do OMP_NUM_THREADS=2 .venv/bin/resdecay demo --data digits --seed $s --no-progress --out runs/repro/digits_t2_seed$s > runs/repro/digits_t2_seed$s.log 2>&1; done
for s in 0 1 2; do OMP_NUM_THREADS=2 .venv/bin/resdecay demo --data fashion-mnist --seed $s --no-progress --out runs/repro/fmnist_t2_seed$s > runs/repro/fmnist_t2_seed$s.log 2>&1; done
OMP_NUM_THREADS=1 .venv/bin/resdecay demo --data fashion-mnist --seed 0 --no-progress --out runs/repro/fmnist_t1_seed0 > runs/repro/fmnist_t1_seed0.log 2>&1
