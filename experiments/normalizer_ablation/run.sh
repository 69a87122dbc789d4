#!/usr/bin/env bash
# normalizer_ablation: every attention normalizer on MQAR, 3 seeds each (vmapped into one program per normalizer).
# Usage: bash experiments/normalizer_ablation/run.sh [extra Hydra overrides, e.g. model=base accelerator=gpu trainer.steps=5000]
# SWEEP=<dir> moves the sweep (default runs/normalizer_ablation, git-ignored); COPY=0 keeps the study folder untouched.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
SWEEP="${SWEEP:-$ROOT/runs/normalizer_ablation}"
COPY="${COPY:-1}"
START=$SECONDS

nice -n 10 "$BIN/attnlab-train" -m task=mqar normalizer=softmax,kl,squared,linear,sigmoid,relu,entmax,softmax1 \
  model=small trainer.steps=400 trainer.eval_every=100 trainer.vmap_seeds=3 trainer.progress=none \
  "hydra.sweep.dir=$SWEEP" "$@"
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by normalizer \
  --metrics test/accuracy test/loss test/ece \
  --baseline normalizer=softmax \
  --curves val/accuracy attn_entropy/layer_0/head_0 grad_norm/global

if [ "$COPY" = 1 ]; then
  cp "$SWEEP/report/report.md" "$HERE/report.md"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
echo "normalizer_ablation: wall time $((SECONDS - START)) s"
