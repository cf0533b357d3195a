#!/usr/bin/env bash
# For a session that is lent a GPU: does the decay's gain, and the plain MAE's direct-path share,
# move with width as the paper's Table 2 says (wider gains more)? Plain MAE vs U-Net MAE alpha_min 0.8 at width
# WIDTH (default 192, 12 blocks, patch 4), Fashion-MNIST-M with all four nuisances on all 60,000 training images,
# EPOCHS epochs (default 16), seeds SEEDS (default "0 1"); each run is then evaluated with kNN, the probe and the
# residual-stream diagnostics (resdecay eval --evals knn,probe,diagnostics), and the rows are collected in one table.
# Sized to fit one 9-minute command on an H100 (4 runs of ~2 minutes); on a CPU, EXTRA shrinks it to a toy that
# checks the command end to end:
#   EXTRA="model.embed_dim=32 model.num_heads=2 model.decoder_embed_dim=32 model.decoder_num_heads=2 model.depth=2
#          model.decoder_depth=1 data.train_subset=256 train.device=cpu" EPOCHS=1 SEEDS=0 EVAL="--max-train 256
#          --max-test 64 --probe-epochs 2 --diag-images 32 --diag-train-images 64 --knockout-images 8" gpu_width.sh OUT
# Usage: gpu_width.sh [--dry-run] [OUT]   (default <repo>/runs/diagnostics-width); ROOT, PYTHON, DRY_RUN: ../common.sh
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../common.sh" "$@"
set -- "${ARGS[@]}"
OUT=${1:-$ROOT/runs/diagnostics-width}; WIDTH=${WIDTH:-192}; EPOCHS=${EPOCHS:-16}; SEEDS=${SEEDS:-"0 1"}
EVAL=${EVAL:-}; EXTRA=${EXTRA:-}
heads=$((WIDTH / 64 > 0 ? WIDTH / 64 : 1))
set -f  # the key=value words hold [...]: never a file pattern
for seed in $SEEDS; do
  for variant in plain decayed; do
    preset=mae-tiny-fmnistm; decay="model.alpha_min=0.8"
    [ "$variant" = plain ] && preset=mae-tiny-fmnistm-plain && decay=""
    run=$OUT/w$WIDTH/seed$seed/$variant
    # shellcheck disable=SC2086  # EXTRA, decay: key=value words
    show "$PYTHON" -m resdecay pretrain --preset $preset --out "$run" --resume auto --no-progress model.embed_dim=$WIDTH \
      model.num_heads=$heads model.depth=12 "data.nuisances=[background,colour,scale,position]" data.train_subset=null \
      train.epochs=$EPOCHS train.seed=$seed train.online_eval_every=0 $decay $EXTRA
    # shellcheck disable=SC2086  # EVAL: flags
    ckpt=$(set +f; ls "$run"/checkpoints/step_*.pt 2>/dev/null | tail -1)
    show "$PYTHON" -m resdecay eval "${ckpt:-$run/checkpoints/LAST.pt}" --evals knn,probe,diagnostics --no-progress $EVAL
  done
done
[ "$DRY_RUN" = 1 ] && exit 0
"$PYTHON" - "$OUT/w$WIDTH" <<'PY'
import json, sys
from pathlib import Path
rows = []
for report in sorted(Path(sys.argv[1]).glob("seed*/*/eval/eval.json")):
    r = json.loads(report.read_text())
    top1 = {x["metric"]: x["values"]["top1"] for x in r["results"] if x["metric"] in ("knn", "probe") and x["feature"] == "mean"}
    last = max(x["layer"] for x in r["results"] if x["metric"] == "diagnostics")
    diag = {x["feature"]: x["values"]["value"] for x in r["results"] if x["metric"] == "diagnostics" and x["layer"] == last}
    rows.append((report.parts[-4], report.parts[-3], top1.get("knn"), top1.get("probe"), diag["direct_share"],
                 diag["direct_share_centred"], diag["pixel_r2"]))
print("| seed | model | kNN | probe | direct share (last) | direct share of variance | pixel R2 |\n|---|---|---|---|---|---|---|")
for row in rows:
    print("| " + " | ".join(f"{v:.4f}" if isinstance(v, float) else str(v) for v in row) + " |")
PY
