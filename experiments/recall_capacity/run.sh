#!/usr/bin/env bash
# recall_capacity: the Zoology experiment at CPU scale. MQAR test accuracy against the number of key-value pairs
# (at d_model 64) and against model width (at 8 pairs) for five sequence mixers: softmax, linear, linear + short
# convolution, a linear/softmax hybrid and sliding-window softmax; seed 0 only (cost; README).
# Each mixer's two sweeps are the presets configs/experiment/recall_capacity/pairs_<mixer>.yaml and
# width_<mixer>.yaml (`attnlab-train -m experiment=recall_capacity/pairs_softmax`); this script runs all ten, the
# report and capacity.py's capacity.md, into $SWEEP/report.
# Usage: bash experiments/recall_capacity/run.sh [extra Hydra overrides, appended to every sweep]
# SCALE=gpu (the _gpu presets: 256 tokens, 16-64 pairs at d_model 128, widths 64-512 at 32 pairs, window 64),
# SWEEP=<dir>, REFRESH=1 (copy the report into this folder): ../study.sh.
set -euo pipefail
STUDY=recall_capacity
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
START=$SECONDS
# capacity.py's two tables: pairs at the pairs sweeps' width, widths at the width sweeps' pairs (the presets').
if [ "$SCALE" = gpu ]; then CAPACITY_AT=(--d-model 128 --pairs 32); else CAPACITY_AT=(--d-model 64 --pairs 8); fi

# One mixer: its pairs sweep into pairs/<mixer>, its width sweep into width/<mixer>. The cell (pairs sweep's width,
# width sweep's pairs) is trained once, by the pairs sweep; capacity.py reads both folders.
for mixer in softmax linear linear_conv hybrid window; do
  nice -n 10 "$BIN/attnlab-train" -m "experiment=recall_capacity/pairs_$mixer$SUFFIX" \
    "hydra.sweep.dir=$SWEEP/pairs/$mixer" "$@"
  nice -n 10 "$BIN/attnlab-train" -m "experiment=recall_capacity/width_$mixer$SUFFIX" \
    "hydra.sweep.dir=$SWEEP/width/$mixer" "$@"
done

nice -n 10 "$BIN/attnlab-report" "$SWEEP" \
  --group-by normalizer model.short_conv model.layer_normalizers model.window model.d_model task.num_kv_pairs \
  --metrics test/accuracy test/loss --curves val/accuracy --records "$SWEEP/report/report.records.json.xz"
nice -n 10 "$BIN/python" "$HERE/capacity.py" "$SWEEP" "${CAPACITY_AT[@]}" > "$SWEEP/report/capacity.md"

if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/report.records.json.xz" "$SWEEP/report/capacity.md" "$HERE/"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
times  # CPU time: the second line is the runs' user and system time
echo "recall_capacity: wall time $((SECONDS - START)) s"
