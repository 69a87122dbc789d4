#!/usr/bin/env bash
# lm_normalizers: every attention normalizer on byte-level language modelling (task=lm), each at 3 learning rates
# spanning 10x, 3 seeds each (vmapped into one program per normalizer and rate); the rate is selected per
# normalizer on validation loss (attnlab-report --select-lr), test bits per byte reported at equal steps, beside
# the task's unigram and bigram baselines (baselines.py), with attention-entropy and gradient-norm curves.
# Usage: bash experiments/lm_normalizers/run.sh [extra Hydra overrides, e.g. task.seq_len=128 trainer.steps=2000]
# SWEEP=<dir> moves the sweep (default runs/lm_normalizers, git-ignored); COPY=0 keeps the study folder untouched.
# Needs task=lm (branch `models`).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
SWEEP="${SWEEP:-$ROOT/runs/lm_normalizers}"
COPY="${COPY:-1}"
START=$SECONDS

# 8 normalizers x 3 rates = 24 programs of 3 vmapped seeds; 64-byte windows and 400 steps to fit ~30 min (README, "Cost").
nice -n 10 "$BIN/attnlab-train" -m task=lm task.seq_len=64 normalizer=softmax,kl,squared,linear,sigmoid,relu,entmax,softmax1 \
  optim.lr=1e-3,3e-3,1e-2 \
  model=small trainer.steps=400 trainer.eval_every=50 trainer.vmap_seeds=3 trainer.progress=none \
  "hydra.sweep.dir=$SWEEP" "$@"
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by normalizer --select-lr --select-by val/loss \
  --metrics test/bits_per_byte test/accuracy \
  --baseline normalizer=softmax \
  --curves val/bits_per_byte train/loss attn_entropy/layer_0/head_0 attn_entropy/layer_1/head_0 grad_norm/global \
  --log-y 'grad_norm/*'
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by normalizer optim.lr \
  --metrics test/bits_per_byte val/bits_per_byte val/loss \
  --curves val/bits_per_byte --out "$SWEEP/report_all_lrs"
nice -n 10 "$BIN/python" "$HERE/baselines.py" "$SWEEP" > "$SWEEP/report/baselines.md"

if [ "$COPY" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/baselines.md" "$HERE/"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  cp "$SWEEP/report_all_lrs/report.md" "$HERE/all_lrs.md"
  cp "$SWEEP/report_all_lrs/curve_val_bits_per_byte.png" "$HERE/all_lrs_curve_val_bits_per_byte.png"
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
echo "lm_normalizers: wall time $((SECONDS - START)) s"
