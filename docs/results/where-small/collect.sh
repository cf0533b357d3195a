#!/usr/bin/env bash
# Copy the finished where-small runs' tables, eval.json, log.jsonl and summary.json beside this script
# (checkpoints stay in the runs' folder).
#
# Usage: collect.sh [RUNS [DEST]]
#   RUNS  the folder run.sh wrote (default <repo>/runs/where-small)
#   DEST  where the copies go (default: beside this script, DEST/seed<N>/<variant>/)
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=${ROOT:-$(cd "$HERE/../../.." && pwd)}
RUNS=${1:-${RUNS:-$ROOT/runs/where-small}}
DEST=${2:-${DEST:-$HERE}}
if [ ! -d "$RUNS" ]; then echo "collect.sh: $RUNS does not exist; pass the folder run.sh wrote" >&2; exit 1; fi
for d in "$RUNS"/seed*; do
  [ -d "$d" ] || continue
  s=$(basename "$d"); mkdir -p "$DEST/$s"
  for f in table.txt ablate.json ablate.png; do [ -f "$d/$f" ] && cp "$d/$f" "$DEST/$s/"; done
  for v in "$d"/*/; do
    n=$(basename "$v"); [ -f "$v/summary.json" ] || continue; mkdir -p "$DEST/$s/$n"
    cp "$v/log.jsonl" "$v/summary.json" "$DEST/$s/$n/"
    [ -f "$v/eval/eval.json" ] && cp "$v/eval/eval.json" "$DEST/$s/$n/"
  done
done
exit 0
