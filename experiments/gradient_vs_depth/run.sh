#!/usr/bin/env bash
# gradient_vs_depth: seed 001's claim "softmax is used to prevent exploding gradient or vanishing gradient problems".
# Short MQAR runs at depth 2, 4, 8 for several normalizers, gradient statistics logged every 5 steps:
# the gradient arriving at each layer's attention scores (score_grad/layer_i) and per-layer parameter
# gradient norms (grad_norm/layer_i); analyze.py tabulates first- vs last-layer score gradients early in training.
# The sweep is the preset configs/experiment/gradient_vs_depth.yaml (`attnlab-train -m experiment=gradient_vs_depth`);
# this script adds the report and analyze.py's depth.md, into $SWEEP/report.
# Usage: bash experiments/gradient_vs_depth/run.sh [extra Hydra overrides]
# SCALE=gpu (the gradient_vs_depth_gpu preset), SWEEP=<dir>, REFRESH=1 (copy the report into this folder): ../study.sh.
set -euo pipefail
STUDY=gradient_vs_depth
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
START=$SECONDS

nice -n 10 "$BIN/attnlab-train" -m "experiment=gradient_vs_depth$SUFFIX" "hydra.sweep.dir=$SWEEP" "$@"
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by model.layers normalizer \
  --metrics test/accuracy test/loss \
  --baseline normalizer=softmax \
  --curves score_grad/layer_0 score_grad/layer_1 grad_norm/layer_0 grad_norm/layer_1 grad_norm/global \
  --log-y 'score_grad/*' 'grad_norm/*' \
  --records "$SWEEP/report/report.records.json.xz"
nice -n 10 "$BIN/python" "$HERE/analyze.py" "$SWEEP" --early-steps 50 > "$SWEEP/report/depth.md"

if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/report.records.json.xz" "$SWEEP/report/depth.md" "$HERE/"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
echo "gradient_vs_depth: wall time $((SECONDS - START)) s"
