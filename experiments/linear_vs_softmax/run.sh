#!/usr/bin/env bash
# linear_vs_softmax: the accuracy cost of linear attention as MQAR's number of key-value pairs grows
# (seed 004's comment: linear attention solves the O(n²) problem — at what price in recall?).
# The cost against sequence length is measured separately: scripts/bench_attention.py, results in BENCHMARKS.md.
# The sweep is the preset configs/experiment/linear_vs_softmax.yaml (`attnlab-train -m experiment=linear_vs_softmax`);
# this script adds the report, into $SWEEP/report.
# Usage: bash experiments/linear_vs_softmax/run.sh [extra Hydra overrides]
# SCALE=gpu (the linear_vs_softmax_gpu preset), SWEEP=<dir>, REFRESH=1 (copy the report into this folder): ../study.sh.
set -euo pipefail
STUDY=linear_vs_softmax
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
START=$SECONDS

nice -n 10 "$BIN/attnlab-train" -m "experiment=linear_vs_softmax$SUFFIX" "hydra.sweep.dir=$SWEEP" "$@"
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by task.num_kv_pairs normalizer \
  --metrics test/accuracy test/loss \
  --baseline normalizer=softmax \
  --curves val/accuracy train/loss \
  --records "$SWEEP/report/report.records.json.xz"

if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/report.records.json.xz" "$HERE/"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
echo "linear_vs_softmax: wall time $((SECONDS - START)) s"
