#!/usr/bin/env bash
# final_softmax: does the output head need a final softmax? (seed 000)
#   classification on digits: head=softmax_ce (final softmax + CE) vs head=scores_mse (raw scores + square loss),
#     accuracy, NLL and ECE before/after temperature scaling;
#   regression on in-context linear regression: head=mse (no final softmax) vs head=hlgauss (softmax over bins).
# Usage: bash experiments/final_softmax/run.sh [extra Hydra overrides, e.g. model=base accelerator=gpu trainer.steps=5000]
# SWEEP=<dir> moves the sweeps (default runs/final_softmax, git-ignored); COPY=0 keeps the study folder untouched.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
SWEEP="${SWEEP:-$ROOT/runs/final_softmax}"
COPY="${COPY:-1}"
START=$SECONDS

# Classification: digits, 3 seeds vmapped into one program per head.
nice -n 10 "$BIN/attnlab-train" -m task=digits head=softmax_ce,scores_mse \
  model=small trainer.steps=600 trainer.eval_every=100 trainer.vmap_seeds=3 trainer.progress=none \
  "hydra.sweep.dir=$SWEEP/classification" "$@"
nice -n 10 "$BIN/attnlab-report" "$SWEEP/classification" --group-by head \
  --metrics test/accuracy test/nll test/nll_ts test/ece test/ece_ts test/temperature test/brier \
  --baseline head=softmax_ce --curves val/accuracy val/loss val/ece

# Regression: in-context linear regression (d=3, 10 pairs), 3 seeds per head.
nice -n 10 "$BIN/attnlab-train" -m task=icl_regression head=mse,hlgauss task.dim=3 task.n_points=10 \
  model=small trainer.steps=800 trainer.eval_every=100 trainer.vmap_seeds=3 trainer.progress=none \
  "hydra.sweep.dir=$SWEEP/regression" "$@"
nice -n 10 "$BIN/attnlab-report" "$SWEEP/regression" --group-by head \
  --metrics test/mse test/mse_rel test/r2 \
  --baseline head=mse --curves val/mse val/r2

if [ "$COPY" = 1 ]; then
  for part in classification regression; do
    mkdir -p "$HERE/$part"
    cp "$SWEEP/$part/report/report.md" "$HERE/$part/report.md"
    cp "$SWEEP/$part/report/"*.png "$HERE/$part/" 2>/dev/null || true
  done
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*/*.png  # 256-colour palette, ~3x smaller
fi
echo "final_softmax: wall time $((SECONDS - START)) s"
