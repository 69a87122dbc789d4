#!/usr/bin/env bash
# gradient_vs_depth: seed 001's claim "softmax is used to prevent exploding gradient or vanishing gradient problems".
# Short MQAR runs at depth 2, 4, 8 for several normalizers, gradient statistics logged every 5 steps:
# the gradient arriving at each layer's attention scores (score_grad/layer_i) and per-layer parameter
# gradient norms (grad_norm/layer_i); analyze.py tabulates first- vs last-layer score gradients early in training.
# Usage: bash experiments/gradient_vs_depth/run.sh [extra Hydra overrides, e.g. model=base accelerator=gpu trainer.steps=2000]
# SWEEP=<dir> moves the sweep (default runs/gradient_vs_depth, git-ignored); COPY=0 keeps the study folder untouched.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
SWEEP="${SWEEP:-$ROOT/runs/gradient_vs_depth}"
COPY="${COPY:-1}"
START=$SECONDS

nice -n 10 "$BIN/attnlab-train" -m task=mqar model.layers=2,4,8 normalizer=softmax,linear,squared,sigmoid \
  model=small trainer.steps=150 trainer.log_every=5 trainer.eval_every=150 trainer.vmap_seeds=2 trainer.progress=none \
  "hydra.sweep.dir=$SWEEP" "$@"
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by model.layers normalizer \
  --metrics test/accuracy test/loss \
  --baseline normalizer=softmax \
  --curves score_grad/layer_0 score_grad/layer_1 grad_norm/layer_0 grad_norm/layer_1 grad_norm/global \
  --log-y 'score_grad/*' 'grad_norm/*'
nice -n 10 "$BIN/python" "$HERE/analyze.py" "$SWEEP" --early-steps 50 > "$SWEEP/report/depth.md"

if [ "$COPY" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/depth.md" "$HERE/"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
echo "gradient_vs_depth: wall time $((SECONDS - START)) s"
