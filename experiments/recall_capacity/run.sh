#!/usr/bin/env bash
# recall_capacity: the Zoology experiment at CPU scale. MQAR test accuracy against the number of key-value pairs
# (at width D_MODEL) and against model width (at WIDTH_PAIRS pairs) for five sequence mixers: softmax, linear,
# linear + short convolution, a linear/softmax hybrid and sliding-window softmax; seed 0 only (cost; README).
# Usage: bash experiments/recall_capacity/run.sh [extra Hydra overrides, appended to every sweep]
# Environment (defaults = the CPU scale): SEQ_LEN=64 PAIRS=4,8,16 D_MODEL=64 WIDTHS=32,128 WIDTH_PAIRS=8 WINDOW=16.
# SWEEP=<dir> moves the sweeps (default runs/recall_capacity, git-ignored); COPY=0 keeps the study folder untouched.
# Needs model.short_conv, model.layer_normalizers and model.window (branch `models`).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
SWEEP="${SWEEP:-$ROOT/runs/recall_capacity}"
COPY="${COPY:-1}"
SEQ_LEN="${SEQ_LEN:-64}" PAIRS="${PAIRS:-4,8,16}" D_MODEL="${D_MODEL:-64}"
WIDTHS="${WIDTHS:-32,128}" WIDTH_PAIRS="${WIDTH_PAIRS:-8}" WINDOW="${WINDOW:-16}"
EXTRA=("$@")
START=$SECONDS

# One mixer: its pairs sweep (width D_MODEL) into pairs/<name>, its width sweep (WIDTH_PAIRS pairs) into width/<name>.
# The cell (D_MODEL, WIDTH_PAIRS) is trained once, by the pairs sweep; capacity.py reads both folders.
mixer() {
  local name=$1
  shift
  nice -n 10 "$BIN/attnlab-train" -m task=mqar "task.seq_len=$SEQ_LEN" "task.num_kv_pairs=$PAIRS" \
    model=small "model.d_model=$D_MODEL" "$@" \
    trainer.steps=800 trainer.eval_every=100 trainer.progress=none \
    "hydra.sweep.dir=$SWEEP/pairs/$name" ${EXTRA[@]+"${EXTRA[@]}"}
  nice -n 10 "$BIN/attnlab-train" -m task=mqar "task.seq_len=$SEQ_LEN" "task.num_kv_pairs=$WIDTH_PAIRS" \
    model=small "model.d_model=$WIDTHS" "$@" \
    trainer.steps=800 trainer.eval_every=100 trainer.progress=none \
    "hydra.sweep.dir=$SWEEP/width/$name" ${EXTRA[@]+"${EXTRA[@]}"}
}
mixer softmax normalizer=softmax
mixer linear normalizer=linear
mixer linear_conv normalizer=linear model.short_conv=4
mixer hybrid normalizer=softmax 'model.layer_normalizers=[linear,softmax]'
mixer window normalizer=softmax "model.window=$WINDOW"

nice -n 10 "$BIN/attnlab-report" "$SWEEP" \
  --group-by normalizer model.short_conv model.layer_normalizers model.window model.d_model task.num_kv_pairs \
  --metrics test/accuracy test/loss --curves val/accuracy
nice -n 10 "$BIN/python" "$HERE/capacity.py" "$SWEEP" --d-model "$D_MODEL" --pairs "$WIDTH_PAIRS" \
  > "$SWEEP/report/capacity.md"

if [ "$COPY" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/capacity.md" "$HERE/"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
times  # CPU time: the second line is the runs' user and system time
echo "recall_capacity: wall time $((SECONDS - START)) s"
