#!/usr/bin/env bash
cd /work/main
for spec in "2 AVX512" "1 AVX512" "2 AVX2" "1 AVX2"; do
  set -- $spec
  OMP_NUM_THREADS=$1 ATEN_CPU_CAPABILITY=${2,,} .venv/bin/resdecay demo --data digits --no-progress --out runs/repro/digits_t$1_$2 > runs/repro/digits_t$1_$2.log 2>&1
done
# MKL's own kernel choice (ATEN_CPU_CAPABILITY does not reach MKL's GEMMs): force its AVX2 code path
MKL_CBWR=AVX2 OMP_NUM_THREADS=2 .venv/bin/resdecay demo --data digits --no-progress --out runs/repro/digits_t2_MKLAVX2 > runs/repro/digits_t2_MKLAVX2.log 2>&1
