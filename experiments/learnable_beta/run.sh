#!/usr/bin/env bash
# learnable_beta: softmax(β·q·kᵀ) with β = exp(θ) learned per head vs fixed at 1/√head_dim (seed 002's β), on MQAR.
# The sweep is the preset configs/experiment/learnable_beta.yaml (`attnlab-train -m experiment=learnable_beta`);
# this script adds the report, into $SWEEP/report.
# Usage: bash experiments/learnable_beta/run.sh [extra Hydra overrides]
# SCALE=gpu (the learnable_beta_gpu preset), SWEEP=<dir>, REFRESH=1 (copy the report into this folder): ../study.sh.
set -euo pipefail
STUDY=learnable_beta
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
START=$SECONDS

nice -n 10 "$BIN/attnlab-train" -m "experiment=learnable_beta$SUFFIX" "hydra.sweep.dir=$SWEEP" "$@"
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by normalizer.learnable \
  --metrics test/accuracy test/loss test/ece \
  --baseline normalizer.learnable=false \
  --curves attn_beta/layer_0/head_0 attn_beta/layer_1/head_0 attn_entropy/layer_0/head_0 attn_entropy/layer_1/head_0 val/loss val/accuracy \
  --records "$SWEEP/report/report.records.json.xz"

if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/report.records.json.xz" "$HERE/"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
echo "learnable_beta: wall time $((SECONDS - START)) s"
