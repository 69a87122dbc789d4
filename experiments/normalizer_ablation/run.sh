#!/usr/bin/env bash
# normalizer_ablation (fair): every attention normalizer on MQAR at its own learning rate, in two stages.
#  1. screen: 8 normalizers x 3 rates spanning 10x (1e-3, 3e-3, 1e-2), seed 0; the rate is selected per normalizer
#     on validation loss (attnlab-report --select-lr).
#  2. confirm: seeds 1 and 2 (vmapped) at each normalizer's selected rate, so the reported cell has 3 seeds.
# The final report selects again over both stages (still on validation) and reports test metrics at that rate.
# Usage: bash experiments/normalizer_ablation/run.sh [extra Hydra overrides, appended to every run]
# SWEEP=<dir> moves the sweep (default runs/normalizer_ablation_lr, git-ignored); COPY=0 keeps the study folder untouched.
# The results of the earlier shared-lr design are kept in history/ (see README.md, "History").
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
SWEEP="${SWEEP:-$ROOT/runs/normalizer_ablation_lr}"
COPY="${COPY:-1}"
NORMALIZERS="${NORMALIZERS:-softmax,kl,squared,linear,sigmoid,relu,entmax,softmax1}"
RATES="${RATES:-1e-3,3e-3,1e-2}"  # the screen's learning rates
EXTRA=("$@")
START=$SECONDS
COMMON=(task=mqar model=small trainer.steps=800 trainer.eval_every=100 trainer.progress=none)

nice -n 10 "$BIN/attnlab-train" -m "normalizer=$NORMALIZERS" "optim.lr=$RATES" seed=0 "${COMMON[@]}" \
  "hydra.sweep.dir=$SWEEP/screen" ${EXTRA[@]+"${EXTRA[@]}"}
nice -n 10 "$BIN/attnlab-report" "$SWEEP/screen" --group-by normalizer --select-lr --select-by val/loss \
  --metrics val/loss val/accuracy --curves
while read -r norm lr; do
  nice -n 10 "$BIN/attnlab-train" "$norm" "$lr" seed=1 trainer.vmap_seeds=2 "${COMMON[@]}" \
    "hydra.run.dir=$SWEEP/confirm/${norm#normalizer=}" ${EXTRA[@]+"${EXTRA[@]}"}
done < <("$BIN/python" "$ROOT/experiments/selected_lrs.py" "$SWEEP/screen/report/report.csv" normalizer)

# Selected rate per normalizer (on val/loss), test metrics at that rate, paired against softmax at its own selected rate.
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by normalizer --select-lr --select-by val/loss \
  --metrics test/accuracy test/loss test/ece \
  --baseline normalizer=softmax \
  --curves val/accuracy attn_entropy/layer_1/head_0 grad_norm/global --log-y 'grad_norm/*'
# Every rate of the screen (seed 0): which rates left the plateau, and when.
nice -n 10 "$BIN/attnlab-report" "$SWEEP/screen" --group-by normalizer optim.lr \
  --metrics test/accuracy val/accuracy val/loss \
  --curves val/accuracy --out "$SWEEP/report_all_lrs"

if [ "$COPY" = 1 ]; then
  cp "$SWEEP/report/report.md" "$HERE/report.md"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  cp "$SWEEP/report_all_lrs/report.md" "$HERE/all_lrs.md"
  cp "$SWEEP/report_all_lrs/curve_val_accuracy.png" "$HERE/all_lrs_curve_val_accuracy.png"
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
times  # CPU time: the second line is the runs' user and system time
echo "normalizer_ablation: wall time $((SECONDS - START)) s"
