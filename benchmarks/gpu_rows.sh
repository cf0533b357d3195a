#!/usr/bin/env bash
# Every GPU row that docs/speed-notes.md leaves unmeasured, in order of importance, each under its
# own time limit so that one session's device time (about 30 minutes) gets the most important
# rows first. Results (JSON + the printed tables) go to $OUT (default: ./gpu-rows).
#
#   bash benchmarks/gpu_rows.sh                 # on the GPU machine, from the repository root
#   bash benchmarks/gpu_rows.sh mae_throughput batch_sweep     # only these rows (each fits a 10-minute command)
#   SMOKE=1 bash benchmarks/gpu_rows.sh         # the same sequence on the CPU with tiny settings (checks the script)
#   SHORT=1 bash benchmarks/gpu_rows.sh         # the GPU rows that fit one 10-minute command (a 15-minute lease):
#                                               # eager first, compiled last, fewer rounds; no JPEG rows
#
# Rows: mae_throughput block_overhead block_overhead_compiled batch_sweep data_throughput train_end_to_end eval_speed
#       parallel_step (DDP vs FSDP2 on one GPU: issue 53)
#
# On the GPU machine, install first with its own PyTorch: pip install --no-deps -e .
# (and pip install nvidia-dali-cuda130 for the DALI rows, where the package can be had).
set -u
ROWS=" mae_throughput mae_throughput_compiled block_overhead block_overhead_compiled batch_sweep data_throughput train_end_to_end eval_speed parallel_step "
for name in "$@"; do
    if [[ "$ROWS" != *" $name "* ]]; then
        echo "gpu_rows.sh: error: unknown row '$name'; rows are:$ROWS" >&2
        exit 2
    fi
done
OUT=${OUT:-gpu-rows}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python}
B=benchmarks

WANTED=" $* "
row() {  # row NAME SECONDS COMMAND...: run (if wanted), keep its output, never stop the sequence
    local name=$1 limit=$2
    shift 2
    [ "$WANTED" = "  " ] || [[ "$WANTED" == *" $name "* ]] || return 0
    echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*" | tee -a "$OUT/summary.txt"
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    grep -v '^W[0-9]' "$OUT/$name.txt" | tail -n 25 | tee -a "$OUT/summary.txt"
    echo "--- $name: exit $rc" | tee -a "$OUT/summary.txt"
}

{ date -u; lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket)'; nvidia-smi 2>/dev/null || echo "no nvidia-smi";
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt" >> "$OUT/summary.txt"

if [ "${SMOKE:-0}" = 1 ]; then
    row block_overhead 300 $PY $B/block_overhead.py --threads 1 --repeats 2 --shape 8,17,64,4 --json "$OUT/block_overhead.json"
    row mae_throughput 300 $PY $B/mae_throughput.py --threads 1 --rounds 1 --steps 1 --warmup 1 --json "$OUT/mae_throughput.json"
    row batch_sweep 300 $PY $B/batch_sweep.py --batches 4,8 --warmup 1 --steps 1 --rounds 1 --json "$OUT/batch_sweep.json"
    row data_throughput 300 $PY $B/data_throughput.py --images 8 --batch 4 --rounds 1 --json "$OUT/data_throughput.json"
    row train_end_to_end 300 $PY $B/train_end_to_end.py --images 16 --batch-size 4 --epochs 2 --log-every 1 --rounds 1 \
        --json "$OUT/train_end_to_end.json"
    row eval_speed 300 $PY $B/eval_speed.py --threads 1 --bank 2000 --queries 200 --probe-epochs 1 --probe-train 2000 \
        --probe-test 500 --rank-rows 2000 --repeats 1 --json "$OUT/eval_speed.json"
    row parallel_step 300 $PY $B/parallel_step.py --threads 1 --presets mae-tiny-digits --batch-size 8 --warmup 1 \
        --steps 1 --rounds 1 --json "$OUT/parallel_step.json"
    exit 0
fi

if [ "${SHORT:-0}" = 1 ]; then
    row mae_throughput 100 $PY $B/mae_throughput.py --preset mae-b16 --device cuda --batch-size 256 --naive --rounds 2 \
        --json "$OUT/mae_throughput.json"
    row block_overhead 45 $PY $B/block_overhead.py --device cuda --repeats 10 --json "$OUT/block_overhead.json"
    row batch_sweep 90 $PY $B/batch_sweep.py --preset mae-b16 --device cuda --batches 128,256,384,512 --rounds 1 \
        --json "$OUT/batch_sweep.json"
    row eval_speed 45 $PY $B/eval_speed.py --device cuda --sections knn --repeats 2 --json "$OUT/eval_speed.json"
    row mae_throughput_compiled 170 $PY $B/mae_throughput.py --preset mae-b16 --device cuda --batch-size 256 --compile \
        --rounds 1 --json "$OUT/mae_throughput_compiled.json"
    row block_overhead_compiled 60 $PY $B/block_overhead.py --device cuda --compile --repeats 10 \
        --json "$OUT/block_overhead_compiled.json"
    exit 0
fi

# 1. The headline: mae-b16 vs the SDPA references, eager and compiled, MFU.
row mae_throughput 570 $PY $B/mae_throughput.py --preset mae-b16 --device cuda --batch-size 256 --compile --naive \
    --json "$OUT/mae_throughput.json"
# 2. The decayed add on ViT-B shapes, eager and compiled.
row block_overhead 240 $PY $B/block_overhead.py --device cuda --json "$OUT/block_overhead.json"
row block_overhead_compiled 300 $PY $B/block_overhead.py --device cuda --compile --json "$OUT/block_overhead_compiled.json"
# 3. The preset's batch per GPU.
row batch_sweep 480 $PY $B/batch_sweep.py --preset mae-b16 --device cuda --batches 128,256,384,512 --compile \
    --json "$OUT/batch_sweep.json"
# 4. From JPEG files: per-core decode rates (DALI on nvJPEG when installed), then the real trainer.
row data_throughput 300 $PY $B/data_throughput.py --images 512 --rounds 3 --json "$OUT/data_throughput.json"
row train_end_to_end 570 $PY $B/train_end_to_end.py --preset mae-b16 --workers "$(( $(nproc) - 1 ))" --images 4096 \
    --batch-size 256 --epochs 3 --log-every 4 --rounds 1 --model-only --json "$OUT/train_end_to_end.json"
# 5. Evaluation with TF32 matmuls (the 1.28M-bank kNN).
row eval_speed 300 $PY $B/eval_speed.py --device cuda --sections knn --json "$OUT/eval_speed.json"
# 6. DDP vs FSDP2 on one GPU (step time, memory, MFU; issue 53): FSDP2's bookkeeping, its sharding needs more ranks.
row parallel_step 400 $PY $B/parallel_step.py --device cuda --presets mae-b16,sit-xl2 --batch-size 64 \
    --json "$OUT/parallel_step.json"
