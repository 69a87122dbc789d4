#!/usr/bin/env bash
# normalizer_ablation (fair): every attention normalizer on MQAR at its own learning rate, in two stages.
#  1. screen: 8 normalizers x 3 rates spanning 10x (1e-3, 3e-3, 1e-2), seed 0; the rate is selected per normalizer
#     on validation loss (attnlab-report --select-lr).
#  2. confirm: seeds 1 and 2 (vmapped) at each normalizer's selected rate, so the reported cell has 3 seeds.
# The final report selects again over both stages (still on validation) and reports test metrics at that rate.
# The stages are the presets configs/experiment/normalizer_ablation/screen.yaml and confirm.yaml
# (`attnlab-train -m experiment=normalizer_ablation/screen`); this script runs both, selects the rates between them and
# writes the reports into $SWEEP/report*.
# Usage: bash experiments/normalizer_ablation/run.sh [extra Hydra overrides, appended to every run; normalizer= and
#   optim.lr= reach the screen only, the confirm stage takes the screen's selection]
# SCALE=gpu (the screen_gpu and confirm_gpu presets), SWEEP=<dir> (default runs/normalizer_ablation_lr), REFRESH=1
# (copy the reports into this folder): ../study.sh.
# The results of the earlier shared-lr design are kept in history/ (see README.md, "History").
set -euo pipefail
STUDY=normalizer_ablation
SWEEP_NAME=normalizer_ablation_lr
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
START=$SECONDS
CONFIRM_EXTRA=()  # the extra overrides but the screen's own keys, whose values the screen selects
for override in "$@"; do
  case "$override" in normalizer=* | optim.lr=*) ;; *) CONFIRM_EXTRA+=("$override") ;; esac
done

nice -n 10 "$BIN/attnlab-train" -m "experiment=normalizer_ablation/screen$SUFFIX" "hydra.sweep.dir=$SWEEP/screen" "$@"
nice -n 10 "$BIN/attnlab-report" "$SWEEP/screen" --group-by normalizer --select-lr --select-by val/loss \
  --metrics val/loss val/accuracy --curves
while read -r norm lr; do
  nice -n 10 "$BIN/attnlab-train" "experiment=normalizer_ablation/confirm$SUFFIX" "$norm" "$lr" \
    "hydra.run.dir=$SWEEP/confirm/${norm#normalizer=}" ${CONFIRM_EXTRA[@]+"${CONFIRM_EXTRA[@]}"}
done < <("$BIN/python" "$ROOT/experiments/selected_lrs.py" "$SWEEP/screen/report/report.csv" normalizer)

# Selected rate per normalizer (on val/loss), test metrics at that rate, paired against softmax at its own selected rate;
# formed: MQAR solved (test accuracy >= 0.99), per seed: the phenomenon the study's claims are about.
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by normalizer --select-lr --select-by val/loss \
  --metrics test/accuracy test/loss test/ece \
  --baseline normalizer=softmax --formed 'test/accuracy>=0.99' \
  --curves val/accuracy attn_entropy/layer_1/head_0 grad_norm/global --log-y 'grad_norm/*' \
  --records "$SWEEP/report/report.records.json.xz"
# Every rate of the screen (seed 0): which rates left the plateau, and when.
nice -n 10 "$BIN/attnlab-report" "$SWEEP/screen" --group-by normalizer optim.lr \
  --metrics test/accuracy val/accuracy val/loss \
  --curves val/accuracy --out "$SWEEP/report_all_lrs" --records "$SWEEP/report_all_lrs/all_lrs.records.json.xz"

if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/report.records.json.xz" "$HERE/"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  cp "$SWEEP/report_all_lrs/report.md" "$HERE/all_lrs.md"
  cp "$SWEEP/report_all_lrs/all_lrs.records.json.xz" "$HERE/"
  cp "$SWEEP/report_all_lrs/curve_val_accuracy.png" "$HERE/all_lrs_curve_val_accuracy.png"
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
times  # CPU time: the second line is the runs' user and system time
echo "normalizer_ablation: wall time $((SECONDS - START)) s"
