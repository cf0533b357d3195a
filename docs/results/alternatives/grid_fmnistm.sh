#!/usr/bin/env bash
# RESULTS §19 (a): Table 3b extended — the decay beside the residual designs and branch scalings that appeared since
# (grid alternatives-fmnistm: the where-map encoder, 8 epochs of 10,000 images) on the where-map's two end cells,
# Fashion-MNIST-M with all four nuisances and clean, seeds 0-2. Each queue item is one (cell, seed, variant) run of
# `resdecay ablate --only`; start two workers (one thread each) to share the queue, then collect with --collect:
#
#   docs/results/alternatives/grid_fmnistm.sh & docs/results/alternatives/grid_fmnistm.sh &   # workers
#   docs/results/alternatives/grid_fmnistm.sh --collect                                       # mean ± std per cell
#
# The all-nuisance cell is at chance after 312 steps; RESULTS §19 (a) ran it again at 936 steps (12 epochs of 20,000):
#
#   CELLS=all EXTRA="data.train_subset=20000 train.epochs=12" grid_fmnistm.sh runs/alternatives/grid-all-e12 &  # x2
#   python docs/results/alternatives/collect_grid.py runs/alternatives/grid-all-e12 --versus "decay 0.8" \
#       --out docs/results/alternatives/grid-all-e12
#
# and RESULTS §19 (a″) at the where-map's own length (32 epochs of 20,000), seeds 0-2, all eleven designs, a few at a time:
#
#   CELLS=all VARIANTS="plain MAE|decay 0.8|alpha 1 + skips|orthogonal" \
#     EXTRA="data.train_subset=20000 train.epochs=32" grid_fmnistm.sh runs/alternatives/grid-all-e32 &  # x2
#   (then the same with VARIANTS="hyper-connections n=4|learnable alpha|drop identity 0.1",
#    "sqrt(0.5) (x + f)|x + sqrt(0.5) f" and "ReZero|LayerScale")
#   python docs/results/alternatives/collect_grid.py runs/alternatives/grid-all-e32 --versus "decay 0.8" \
#       --out docs/results/alternatives/grid-all-e32
#
# and EP and the swept linear heads (issue 50's probes) on every finished run of RUNS that lacks them, the grid's banks
# (10,000 train -> 10,000 test images, last block), written to <run>/eval-probes and read by collect_grid.py:
#
#   CELLS=all grid_fmnistm.sh --probes runs/alternatives/grid-all-e32 &  # x2: workers share the runs
#
# RESULTS §19 (a)'s clean cell was run again the same way, to be read by them (collect with --versus "decay 0.8"):
#
#   CELLS=clean grid_fmnistm.sh runs/alternatives/grid-clean &  # x2, then --probes on the same folder
#
# Usage: grid_fmnistm.sh [--dry-run] [--collect | --probes] [RUNS]   (RUNS default <repo>/runs/alternatives/grid)
#   CELLS (default "all clean"), SEEDS (default "0 1 2"), VARIANTS (a |-separated list; default every variant),
#   EXTRA (more key=value overrides, e.g. a toy size); ROOT, RESDECAY, DRY_RUN: docs/results/common.sh
# Needs the Debian package dataset-fashion-mnist. About 1.5 CPU-minutes per run uncontended (2-core AVX-512 VM).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
COLLECT=0
REST=()
PROBES=0
for arg in "$@"; do
  case $arg in --collect) COLLECT=1 ;; --probes) PROBES=1 ;; *) REST+=("$arg") ;; esac
done
if [ "$COLLECT" = 1 ] && [ "$PROBES" = 1 ]; then
  echo "grid_fmnistm.sh: --collect and --probes are two steps: give one (--probes first, then --collect)" >&2; exit 2
fi
source "$HERE/../common.sh" "${REST[@]}"
set -f  # the key=value words below hold [...]: never a file pattern
RUNS=${ARGS[0]:-$ROOT/runs/alternatives/grid}
GRID=alternatives-fmnistm
declare -A NUIS=([all]="[background,colour,scale,position]" [clean]="[]")
CELLS=${CELLS:-all clean}
SEEDS=${SEEDS:-0 1 2}
DEFAULT_VARIANTS="plain MAE|alpha 1 + skips|sqrt(0.5) (x + f)|x + sqrt(0.5) f|decay 0.8|learnable alpha|orthogonal"
DEFAULT_VARIANTS+="|hyper-connections n=4|ReZero|LayerScale|drop identity 0.1"
IFS='|' read -r -a VARIANT_LIST <<< "${VARIANTS:-$DEFAULT_VARIANTS}"
if [ "$PROBES" = 1 ]; then
  set +f  # the run folders and their checkpoints are found by pattern
  export OMP_NUM_THREADS=1  # one thread per worker, as the grid's runs (train.threads=1)
  finished=0
  for cell in $CELLS; do compgen -G "$RUNS/$cell/seed*/*/eval/eval.json" > /dev/null && finished=1; done
  if [ "$finished" = 0 ]; then
    echo "grid_fmnistm.sh --probes: no finished run in $RUNS (cells $CELLS); give the RUNS folder the grid wrote" >&2
    exit 2
  fi
  for cell in $CELLS; do
    for run in "$RUNS/$cell"/seed*/*/; do
      run=${run%/}
      checkpoints=("$run"/checkpoints/step_*.pt)
      # finished (its grid evaluation written) and not yet measured by the probes; 10,000: the grid's eval.max_train
      [ -f "$run/eval/eval.json" ] && [ -f "${checkpoints[-1]}" ] || continue
      compgen -G "$run/eval-probes/*/eval.json" > /dev/null && continue
      if claim "$RUNS/.claims-probes" "${run//[^A-Za-z0-9]/_}"; then
        show nice -n 10 "$RESDECAY" eval "${checkpoints[-1]}" --evals ep,linear_sweep --max-train 10000 \
          --out "$run/eval-probes" --no-baselines --no-progress || echo "FAILED probes $run"
      fi
    done
  done
  exit 0
fi
if [ "$COLLECT" = 1 ]; then
  only=$(IFS=,; echo "${VARIANT_LIST[*]}")
  for cell in $CELLS; do
    # shellcheck disable=SC2086  # EXTRA: key=value words
    show "$RESDECAY" ablate --grid "$GRID" --only "$only" --seeds "$(echo $SEEDS | tr ' ' ,)" --out "$RUNS/$cell" \
      "data.nuisances=${NUIS[$cell]}" train.threads=1 ${EXTRA:-} --no-progress
  done
  exit 0
fi
for cell in $CELLS; do
  for seed in $SEEDS; do
    for variant in "${VARIANT_LIST[@]}"; do
      if claim "$RUNS/.claims" "$cell-$seed-${variant//[^A-Za-z0-9]/_}"; then
        # shellcheck disable=SC2086  # EXTRA: key=value words
        show nice -n 10 "$RESDECAY" ablate --grid "$GRID" --only "$variant" --out "$RUNS/$cell/seed$seed" \
          "data.nuisances=${NUIS[$cell]}" "train.seed=$seed" train.threads=1 ${EXTRA:-} --no-progress \
          || echo "FAILED $cell seed $seed $variant"
      fi
    done
  done
done
