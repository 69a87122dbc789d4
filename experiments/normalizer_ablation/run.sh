#!/usr/bin/env bash
# normalizer_ablation (fair): every attention normalizer on MQAR, each at 3 learning rates spanning 10x, 3 seeds each
# (vmapped into one program per normalizer and rate); the rate is selected per normalizer on validation loss
# (attnlab-report --select-lr), test metrics are reported at that rate. A second report shows every rate.
# Usage: bash experiments/normalizer_ablation/run.sh [extra Hydra overrides, e.g. trainer.steps=2000 trainer.eval_every=100]
# SWEEP=<dir> moves the sweep (default runs/normalizer_ablation_lr, git-ignored); COPY=0 keeps the study folder untouched.
# The results of the earlier shared-lr design are kept in history/ (see README.md, "History").
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
SWEEP="${SWEEP:-$ROOT/runs/normalizer_ablation_lr}"
COPY="${COPY:-1}"
START=$SECONDS

# 8 normalizers x 3 rates = 24 programs of 3 vmapped seeds; 450 steps fit ~30 min on 2 idle cores (README, "Cost").
nice -n 10 "$BIN/attnlab-train" -m task=mqar normalizer=softmax,kl,squared,linear,sigmoid,relu,entmax,softmax1 \
  optim.lr=1e-3,3e-3,1e-2 \
  model=small trainer.steps=450 trainer.eval_every=50 trainer.vmap_seeds=3 trainer.progress=none \
  "hydra.sweep.dir=$SWEEP" "$@"
# Selected rate per normalizer (on val/loss), test metrics at that rate, paired against softmax at its own rate.
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by normalizer --select-lr --select-by val/loss \
  --metrics test/accuracy test/loss test/ece \
  --baseline normalizer=softmax \
  --curves val/accuracy attn_entropy/layer_1/head_0 grad_norm/global
# Every rate: does any run still sit on the plateau at the end, and at which rate did each normalizer leave it?
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by normalizer optim.lr \
  --metrics test/accuracy val/accuracy val/loss \
  --curves val/accuracy --out "$SWEEP/report_all_lrs"

if [ "$COPY" = 1 ]; then
  cp "$SWEEP/report/report.md" "$HERE/report.md"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  cp "$SWEEP/report_all_lrs/report.md" "$HERE/all_lrs.md"
  cp "$SWEEP/report_all_lrs/curve_val_accuracy.png" "$HERE/all_lrs_curve_val_accuracy.png"
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
echo "normalizer_ablation: wall time $((SECONDS - START)) s"
