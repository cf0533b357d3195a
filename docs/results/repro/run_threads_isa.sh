#!/usr/bin/env bash
# RESULTS §12's thread-count and CPU-kernel runs of the digits demo (seed 0): 1 and 2 threads x AVX512 and AVX2
# kernels (ATEN_CPU_CAPABILITY), and MKL's own AVX2 code path (MKL_CBWR; ATEN_CPU_CAPABILITY does not reach MKL's GEMMs).
#
# Usage: run_threads_isa.sh [--dry-run]
#   RUNS  the demo runs' folder (default <repo>/runs/repro): RUNS/digits_t<threads>_<kernels>/ and .log
#   ROOT, RESDECAY, DRY_RUN: docs/results/common.sh
# --dry-run prints each demo command instead of running it.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../common.sh" "$@"
RUNS=${RUNS:-$ROOT/runs/repro}
for spec in "2 AVX512" "1 AVX512" "2 AVX2" "1 AVX2"; do
  read -r threads isa <<< "$spec"
  name=digits_t${threads}_$isa
  logged "$RUNS/$name.log" env OMP_NUM_THREADS="$threads" ATEN_CPU_CAPABILITY="${isa,,}" "$RESDECAY" demo --data digits \
    --no-progress --out "$RUNS/$name" || echo "FAILED $name (log: $RUNS/$name.log)"
done
logged "$RUNS/digits_t2_MKLAVX2.log" env MKL_CBWR=AVX2 OMP_NUM_THREADS=2 "$RESDECAY" demo --data digits --no-progress \
  --out "$RUNS/digits_t2_MKLAVX2" || echo "FAILED digits_t2_MKLAVX2 (log: $RUNS/digits_t2_MKLAVX2.log)"
