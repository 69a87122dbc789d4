#!/usr/bin/env bash
# lm_normalizers: every attention normalizer on byte-level language modelling (task=lm) at its own learning rate,
# in two stages (as normalizer_ablation):
#  1. screen: 8 normalizers x 3 rates spanning 10x (1e-3, 3e-3, 1e-2), seed 0; the rate is selected per normalizer
#     on validation loss (attnlab-report --select-lr);
#  2. confirm: seeds 1 and 2 (vmapped) at each normalizer's selected rate, so the reported cell has 3 seeds.
# Test bits per byte at equal steps, beside the unigram and bigram baselines (baselines.py), with attention-entropy
# and gradient-norm curves.
# Usage: bash experiments/lm_normalizers/run.sh [extra Hydra overrides, e.g. task.seq_len=128 trainer.steps=2000]
# SWEEP=<dir> moves the sweep (default runs/lm_normalizers, git-ignored); COPY=0 keeps the study folder untouched.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
SWEEP="${SWEEP:-$ROOT/runs/lm_normalizers}"
COPY="${COPY:-1}"
NORMALIZERS="${NORMALIZERS:-softmax,kl,squared,linear,sigmoid,relu,entmax,softmax1}"
RATES="${RATES:-1e-3,3e-3,1e-2}"  # the screen's learning rates
EXTRA=("$@")
START=$SECONDS
# 64-byte windows and 400 steps keep the two stages near 30 min on 2 cores (README, "Cost").
COMMON=(task=lm task.seq_len=64 model=small trainer.steps=400 trainer.eval_every=50 trainer.progress=none)

nice -n 10 "$BIN/attnlab-train" -m "normalizer=$NORMALIZERS" "optim.lr=$RATES" seed=0 "${COMMON[@]}" \
  "hydra.sweep.dir=$SWEEP/screen" ${EXTRA[@]+"${EXTRA[@]}"}
nice -n 10 "$BIN/attnlab-report" "$SWEEP/screen" --group-by normalizer --select-lr --select-by val/loss \
  --metrics val/loss val/bits_per_byte --curves
while read -r norm lr; do
  nice -n 10 "$BIN/attnlab-train" "$norm" "$lr" seed=1 trainer.vmap_seeds=2 "${COMMON[@]}" \
    "hydra.run.dir=$SWEEP/confirm/${norm#normalizer=}" ${EXTRA[@]+"${EXTRA[@]}"}
done < <("$BIN/python" "$ROOT/experiments/selected_lrs.py" "$SWEEP/screen/report/report.csv" normalizer)

nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by normalizer --select-lr --select-by val/loss \
  --metrics test/bits_per_byte test/accuracy \
  --baseline normalizer=softmax \
  --curves val/bits_per_byte train/loss attn_entropy/layer_0/head_0 attn_entropy/layer_1/head_0 grad_norm/global \
  --log-y 'grad_norm/*'
nice -n 10 "$BIN/attnlab-report" "$SWEEP/screen" --group-by normalizer optim.lr \
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
times  # CPU time: the second line is the runs' user and system time
echo "lm_normalizers: wall time $((SECONDS - START)) s"
