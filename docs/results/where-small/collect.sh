#!/usr/bin/env bash
# Copy the finished where-small runs' tables, eval.json, log.jsonl and summary.json here (checkpoints stay in runs/).
cd "$(dirname "$0")/../../.."
for d in runs/where-small/seed*; do
  s=$(basename "$d"); mkdir -p docs/results/where-small/$s
  cp "$d"/table.txt "$d"/ablate.json "$d"/ablate.png docs/results/where-small/$s/ 2>/dev/null
  for v in "$d"/*/; do
    n=$(basename "$v"); [ -f "$v/summary.json" ] || continue; mkdir -p docs/results/where-small/$s/$n
    cp "$v"/log.jsonl "$v"/summary.json docs/results/where-small/$s/$n/; cp "$v"/eval/eval.json docs/results/where-small/$s/$n/ 2>/dev/null
  done
done
