#!/usr/bin/env bash
# length_extrapolation: MQAR trained at 32 tokens and tested at 32 … 512 (1–16×, the same 4 key-value pairs in a
# longer context), 3 vmapped seeds per configuration, each normalizer at the rate normalizer_ablation's screen
# selected for it (softmax, sigmoid 3e-3; linear 1e-2); ssmax and stick-breaking, absent from that screen, at
# softmax's 3e-3 (screened afterwards: see README). RoPE and no positional encoding: softmax, ssmax,
# stick-breaking, sigmoid, linear.
# The two positional settings run as two parallel streams.
# lm step: byte-level lm trained at 64 bytes and tested at 64 … 1024 (1–16×), softmax, ssmax and stick-breaking with
# RoPE and with no positional encoding, 3 vmapped seeds, all at softmax's rate in lm_normalizers' screen (1e-2).
# Every sweep is a preset in configs/experiment/length_extrapolation/ (rope, rope_sigmoid, ..., lm_none_lr_screen;
# `attnlab-train -m experiment=length_extrapolation/rope`); this script runs them, copies each screen's runs beside
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
(
  nice -n 10 "$BIN/attnlab-train" -m "experiment=length_extrapolation/rope$SUFFIX" \
    "hydra.sweep.dir=$SWEEP/rope" "$@"
  nice -n 10 "$BIN/attnlab-train" -m "experiment=length_extrapolation/rope_sigmoid$SUFFIX" \
    "hydra.sweep.dir=$SWEEP/rope_sigmoid" "$@"
  nice -n 10 "$BIN/attnlab-train" -m "experiment=length_extrapolation/rope_linear$SUFFIX" \
    "hydra.sweep.dir=$SWEEP/rope_linear" "$@"
) > "$SWEEP/rope.log" 2>&1 &
nice -n 10 "$BIN/attnlab-train" -m "experiment=length_extrapolation/none$SUFFIX" \
    "hydra.sweep.dir=$SWEEP/none" "$@" > "$SWEEP/none.log" 2>&1
nice -n 10 "$BIN/attnlab-train" -m "experiment=length_extrapolation/none_sigmoid$SUFFIX" \
    "hydra.sweep.dir=$SWEEP/none_sigmoid" "$@" > "$SWEEP/none_sigmoid.log" 2>&1
nice -n 10 "$BIN/attnlab-train" -m "experiment=length_extrapolation/none_linear$SUFFIX" \
    "hydra.sweep.dir=$SWEEP/none_linear" "$@" > "$SWEEP/none_linear.log" 2>&1
# Longer (1500 steps): softmax and ssmax with RoPE, which had not left MQAR's plateau at 500 steps.
nice -n 10 "$BIN/attnlab-train" -m "experiment=length_extrapolation/rope_long$SUFFIX" \
    "hydra.sweep.dir=$SWEEP/rope_long" "$@" > "$SWEEP/long.log" 2>&1
wait
# A learning-rate screen with RoPE at 500 steps: 1e-3 and 1e-2 beside the 3e-3 runs above (linear left out), in a
# folder of its own (beside $SWEEP, so the main report's cells keep one rate), reported with the 3e-3 runs copied in.
SCREEN="${SWEEP}_lr_screen"
mkdir -p "$SCREEN"
nice -n 10 "$BIN/attnlab-train" -m "experiment=length_extrapolation/rope_lr_screen$SUFFIX" \
    "hydra.sweep.dir=$SCREEN/rope_screen" "$@" > "$SCREEN/screen.log" 2>&1
rm -rf "$SCREEN/rope" "$SCREEN/rope_sigmoid"
cp -r "$SWEEP/rope" "$SWEEP/rope_sigmoid" "$SCREEN/"
rm -rf "$SCREEN/rope/report" "$SCREEN/rope_sigmoid/report"
nice -n 10 "$BIN/attnlab-report" "$SCREEN" --group-by normalizer --select-lr --metrics test/accuracy val/loss
# The same screen at 1500 steps for softmax and ssmax (RoPE): 1e-3 and 1e-2 beside the 3e-3 runs of rope_long.
LONG="${SWEEP}_long_lr_screen"
mkdir -p "$LONG"
nice -n 10 "$BIN/attnlab-train" -m "experiment=length_extrapolation/rope_long_lr_screen$SUFFIX" \
    "hydra.sweep.dir=$LONG/rope_long_screen" "$@" > "$LONG/screen.log" 2>&1
rm -rf "$LONG/rope_long"
cp -r "$SWEEP/rope_long" "$LONG/"
rm -rf "$LONG/rope_long/report"
nice -n 10 "$BIN/attnlab-report" "$LONG" --group-by normalizer --select-lr \
  --metrics test/accuracy test_len/512/accuracy val/loss --baseline normalizer=softmax
# The screen without positions (500 steps): 1e-3 and 1e-2 beside the 3e-3 runs (linear: 1e-3 and 3e-3 beside 1e-2).
NONE="${SWEEP}_none_lr_screen"
mkdir -p "$NONE"
nice -n 10 "$BIN/attnlab-train" -m "experiment=length_extrapolation/none_lr_screen$SUFFIX" \
    "hydra.sweep.dir=$NONE/none_screen" "$@" > "$NONE/screen.log" 2>&1
nice -n 10 "$BIN/attnlab-train" -m "experiment=length_extrapolation/none_linear_lr_screen$SUFFIX" \
    "hydra.sweep.dir=$NONE/none_linear_screen" "$@" > "$NONE/linear_screen.log" 2>&1
rm -rf "$NONE/none" "$NONE/none_sigmoid" "$NONE/none_linear"
cp -r "$SWEEP/none" "$SWEEP/none_sigmoid" "$SWEEP/none_linear" "$NONE/"
rm -rf "$NONE/none/report" "$NONE/none_sigmoid/report" "$NONE/none_linear/report"
nice -n 10 "$BIN/attnlab-report" "$NONE" --group-by normalizer --select-lr --metrics test/accuracy val/loss

nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by model.positional normalizer trainer.steps \
  --metrics test/accuracy test/loss --baseline normalizer=softmax --curves val/accuracy

if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$HERE/report.md"
  cp "$SCREEN/report/report.md" "$HERE/lr_screen.md"
  cp "$LONG/report/report.md" "$HERE/lr_screen_long.md"
  cp "$LONG/report/lengths.png" "$HERE/lengths_long.png"
  cp "$NONE/report/report.md" "$HERE/lr_screen_none.md"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
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
