#!/usr/bin/env bash
# length_dispersion: max weight, normalised entropy and accuracy against the number of keys n on max retrieval
# (Veličković et al. 2024), trained at 16 items and tested at 16 … 1024 (64×), for softmax (β fixed, β learnable,
# each ± adaptive temperature at evaluation), ssmax, sigmoid (bias −log n) and stick-breaking; 3 vmapped seeds each.
# The closed-form curves at initialisation come from init_curves.py (no training).
# The sweeps are the presets configs/experiment/length_dispersion/{softmax,others}.yaml and their learning-rate
# screens {softmax,others}_lr_screen.yaml (`attnlab-train -m experiment=length_dispersion/softmax`); this script
# runs all four, query_rows.py, init_curves.py and the reports, into $SWEEP/report, ${SWEEP}_lr_screen/report
# and ${SWEEP}_selected_lr/report.
# Usage: bash experiments/length_dispersion/run.sh [extra Hydra overrides, appended to every run]
# SCALE=gpu (the _gpu presets), SWEEP=<dir>, REFRESH=1 (copy the reports into this folder): ../study.sh.
set -euo pipefail
STUDY=length_dispersion
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
START=$SECONDS

nice -n 10 "$BIN/attnlab-train" -m "experiment=length_dispersion/softmax$SUFFIX" "hydra.sweep.dir=$SWEEP/softmax" "$@"
nice -n 10 "$BIN/attnlab-train" -m "experiment=length_dispersion/others$SUFFIX" "hydra.sweep.dir=$SWEEP/others" "$@"

# The query row's max weight and entropy per test length, read from the trained checkpoints (query_rows.py).
nice -n 10 "$BIN/python" "$HERE/query_rows.py" "$SWEEP" "$SWEEP/report"
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by normalizer normalizer.learnable normalizer.adaptive_temperature \
  --metrics test/accuracy 'test_len/*/attn_max_weight/layer_0' --curves val/accuracy \
  --records "$SWEEP/report/report.records.json.xz"
nice -n 10 "$BIN/python" "$HERE/init_curves.py" "$SWEEP/report"

# A learning-rate screen: 1e-3 and 1e-2 for every trained configuration, beside the 3e-3 runs above, in a folder of
# its own (beside $SWEEP, so the main report's cells keep one rate), reported with the 3e-3 runs copied in.
SCREEN="${SWEEP}_lr_screen"
mkdir -p "$SCREEN"
nice -n 10 "$BIN/attnlab-train" -m "experiment=length_dispersion/others_lr_screen$SUFFIX" \
  "hydra.sweep.dir=$SCREEN/others_screen" "$@" > "$SCREEN/others_screen.log" 2>&1
nice -n 10 "$BIN/attnlab-train" -m "experiment=length_dispersion/softmax_lr_screen$SUFFIX" \
  "hydra.sweep.dir=$SCREEN/softmax_screen" "$@" > "$SCREEN/softmax_screen.log" 2>&1
rm -rf "$SCREEN/softmax" "$SCREEN/others"
cp -r "$SWEEP/softmax" "$SWEEP/others" "$SCREEN/"
nice -n 10 "$BIN/attnlab-report" "$SCREEN" --group-by normalizer normalizer.learnable normalizer.adaptive_temperature \
  --select-lr --metrics test/accuracy test_len/256/accuracy test_len/1024/accuracy val/loss \
  --baseline normalizer.adaptive_temperature=off --records "$SCREEN/report/report.records.json.xz"
# The query rows at the rate the screen selected for every configuration (1e-2).
SELECTED="${SWEEP}_selected_lr"
rm -rf "$SELECTED"
mkdir -p "$SELECTED/softmax_screen" "$SELECTED/others_screen"
cp -r "$SCREEN/softmax_screen/"*optim.lr=0.01 "$SELECTED/softmax_screen/"
cp -r "$SCREEN/others_screen/"*optim.lr=0.01 "$SELECTED/others_screen/"
nice -n 10 "$BIN/python" "$HERE/query_rows.py" "$SELECTED" "$SELECTED/report"

if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/report.records.json.xz" "$SWEEP/report/init.md" \
    "$SWEEP/report/query_rows.md" "$HERE/"
  cp "$SCREEN/report/report.md" "$HERE/lr_screen.md"
  cp "$SCREEN/report/report.records.json.xz" "$HERE/lr_screen.records.json.xz"
  cp "$SCREEN/report/lengths.png" "$HERE/lengths_lr_screen.png"
  cp "$SELECTED/report/query_rows.md" "$HERE/query_rows_selected_lr.md"
  cp "$SELECTED/report/query_rows.png" "$HERE/query_rows_selected_lr.png"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
times  # CPU time: the second line is the runs' user and system time
echo "length_dispersion: wall time $((SECONDS - START)) s"
