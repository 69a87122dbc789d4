#!/usr/bin/env bash
# length_extrapolation: MQAR trained at 32 tokens for 2000 steps and tested at 32 … 512 (1–16×, the same 4 key-value
# pairs in a longer context), 3 vmapped seeds per configuration: softmax, ssmax, stick-breaking, sigmoid and linear with
# RoPE and with no positional encoding, each at its own rate (a screen per encoding, bracketed), the two encodings as
# two parallel streams.
# lm step: byte-level lm trained at 64 bytes and tested at 64 … 1024 (1–16×), softmax, ssmax and stick-breaking with
# RoPE and with no positional encoding, 3 vmapped seeds, all at softmax's rate in lm_normalizers' screen (1e-2).
# Every sweep is a preset in configs/experiment/length_extrapolation/ (screen, lm_none, lm_rope, lm_none_lr_screen;
# `attnlab-train -m experiment=length_extrapolation/screen`); this script runs them, copies the lm screen's runs beside
# the runs it is compared with, and writes the reports into $SWEEP/report and the folders beside $SWEEP.
# Usage: bash experiments/length_extrapolation/run.sh [extra Hydra overrides, appended to every run]
# PARTS="mqar lm lm_screen" (default) names the steps to run, e.g. PARTS=lm (lm_screen reads the lm step's runs).
# SCALE=gpu (the _gpu presets; mqar and lm only, the README names no GPU scale for lm_screen), SWEEP=<dir> (the lm
# runs go to ${SWEEP}_lm), REFRESH=1 (copy the reports of PARTS into this folder): ../study.sh.
set -euo pipefail
STUDY=length_extrapolation
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
if [ "$SCALE" = gpu ]; then PARTS=" ${PARTS:-mqar lm} "; else PARTS=" ${PARTS:-mqar lm lm_screen} "; fi
if [ "$SCALE" = gpu ] && [[ "$PARTS" == *" lm_screen "* ]]; then
  echo "length_extrapolation: PARTS=lm_screen has no GPU scale; SCALE=gpu runs PARTS=\"mqar lm\"" >&2
  exit 2
fi
START=$SECONDS

if [[ "$PARTS" == *" mqar "* ]]; then
mkdir -p "$SWEEP"
# The two positional encodings as two parallel streams, each a learning-rate screen (1e-3, 3e-3) extended by one round
# where a cell's selected rate is at an edge of its grid; each configuration is 3 vmapped seeds, so the screen's runs
# are the compared cells.
STREAMS=()
for pos in rope none; do
  bracket_screen "$SWEEP/$pos" normalizer 1 --metrics val/loss test/accuracy -- \
    "experiment=length_extrapolation/screen$SUFFIX" "model.positional=$pos" "$@" > "$SWEEP/$pos.log" 2>&1 &
  STREAMS+=("$!")
done
for pid in "${STREAMS[@]}"; do wait "$pid"; done  # a failed stream stops the study here (set -e)
# Each normalizer at its own selected rate (val/loss), paired against softmax at the same positional encoding;
# formed: MQAR learned at the training length (test accuracy >= 0.9 on each seed; the plateau of a model that knows only
# that the answer is one of the 4 values is ~0.27), the condition for a length comparison to be tested.
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by model.positional normalizer --select-lr \
  --select-by val/loss --metrics test/accuracy test_len/512/accuracy test/loss --baseline normalizer=softmax \
  --formed 'test/accuracy>=0.9' --curves val/accuracy --records "$SWEEP/report/report.records.json.xz"
if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/report.records.json.xz" "$SWEEP/report/"*.png "$HERE/"
  for pos in rope none; do
    cp "$SWEEP/$pos/report/report.md" "$HERE/lr_screen_$pos.md"
    cp "$SWEEP/$pos/report/report.records.json.xz" "$HERE/lr_screen_$pos.records.json.xz"
  done
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
fi

# lm: 64-byte windows, 400 steps, the setting of lm_normalizers (whose screen selected 1e-2 for softmax); each test
# length holds the same 32,000 predicted bytes (n_test auto). One stream; stick-breaking with RoPE last.
if [[ "$PARTS" == *" lm "* ]]; then
LM_SWEEP="${SWEEP}_lm"
mkdir -p "$LM_SWEEP"
nice -n 10 "$BIN/attnlab-train" -m "experiment=length_extrapolation/lm_none$SUFFIX" \
    "hydra.sweep.dir=$LM_SWEEP/none" "$@" > "$LM_SWEEP/none.log" 2>&1
nice -n 10 "$BIN/attnlab-train" -m "experiment=length_extrapolation/lm_rope$SUFFIX" \
    "hydra.sweep.dir=$LM_SWEEP/rope" "$@" > "$LM_SWEEP/rope.log" 2>&1
nice -n 10 "$BIN/attnlab-report" "$LM_SWEEP" --group-by model.positional normalizer \
  --metrics test/bits_per_byte test/loss --baseline normalizer=softmax --curves val/bits_per_byte
if [ "$REFRESH" = 1 ]; then
  cp "$LM_SWEEP/report/report.md" "$HERE/lm_report.md"
  for png in "$LM_SWEEP/report/"*.png; do cp "$png" "$HERE/lm_$(basename "$png")"; done
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/lm_*.png
fi
fi

# lm rate screen without positions: 3e-2 (above 1e-2, the top of lm_normalizers' grid) beside the 1e-2 runs above, in
# a folder of its own with those runs copied in, reported with --select-lr on val/loss.
if [[ "$PARTS" == *" lm_screen "* ]]; then
LM_SCREEN="${SWEEP}_lm_screen"
mkdir -p "$LM_SCREEN"
nice -n 10 "$BIN/attnlab-train" -m "experiment=length_extrapolation/lm_none_lr_screen" \
    "hydra.sweep.dir=$LM_SCREEN/none_3e-2" "$@" > "$LM_SCREEN/screen.log" 2>&1
rm -rf "$LM_SCREEN/none"
cp -r "${SWEEP}_lm/none" "$LM_SCREEN/"
rm -rf "$LM_SCREEN/none/report"
nice -n 10 "$BIN/attnlab-report" "$LM_SCREEN" --group-by normalizer --select-lr --metrics test/bits_per_byte val/loss
if [ "$REFRESH" = 1 ]; then cp "$LM_SCREEN/report/report.md" "$HERE/lm_lr_screen.md"; fi
fi
times  # CPU time: the second line is the runs' user and system time
echo "length_extrapolation: wall time $((SECONDS - START)) s"
