#!/usr/bin/env bash
# learnable_beta: softmax(β·q·kᵀ) with β = exp(θ) learned per head vs fixed at 1/√head_dim (seed 002's β), on MQAR.
# Usage: bash experiments/learnable_beta/run.sh [extra Hydra overrides, e.g. model=base accelerator=gpu trainer.steps=5000]
# SWEEP=<dir> moves the sweep (default runs/learnable_beta, git-ignored); COPY=0 keeps the study folder untouched.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
SWEEP="${SWEEP:-$ROOT/runs/learnable_beta}"
COPY="${COPY:-1}"
START=$SECONDS

nice -n 10 "$BIN/attnlab-train" -m task=mqar normalizer=softmax normalizer.learnable=true,false \
  model=small trainer.steps=500 trainer.log_every=25 trainer.eval_every=100 trainer.vmap_seeds=3 trainer.progress=none \
  "hydra.sweep.dir=$SWEEP" "$@"
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by normalizer.learnable \
  --metrics test/accuracy test/loss test/ece \
  --baseline normalizer.learnable=false \
  --curves attn_beta/layer_0/head_0 attn_beta/layer_1/head_0 attn_entropy/layer_0/head_0 attn_entropy/layer_1/head_0 val/loss val/accuracy

if [ "$COPY" = 1 ]; then
  cp "$SWEEP/report/report.md" "$HERE/report.md"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
echo "learnable_beta: wall time $((SECONDS - START)) s"
