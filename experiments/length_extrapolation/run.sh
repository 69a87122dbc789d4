#!/usr/bin/env bash
# length_extrapolation: MQAR trained at 32 tokens for 2000 steps and tested at 32 … 512 (1–16×, the same 4 key-value
# pairs in a longer context), 3 vmapped seeds per configuration: softmax, ssmax, stick-breaking, sigmoid and linear with
# RoPE and with no positional encoding, each at its own rate (a screen per encoding, bracketed), the two encodings as
# two parallel streams.
# lm step: byte-level lm trained at 64 bytes and tested at 64 … 1024 (1–16×), softmax, ssmax and stick-breaking with
# RoPE and with no positional encoding, 3 vmapped seeds, each at its own rate (a screen per encoding, bracketed).
# Each step's sweep is a preset in configs/experiment/length_extrapolation/ (screen, lm_screen;
# `attnlab-train -m experiment=length_extrapolation/screen`); this script runs them as screens and writes the reports
# into $SWEEP/report and ${SWEEP}_lm/report.
# Usage: bash experiments/length_extrapolation/run.sh [extra Hydra overrides, appended to every run]
# PARTS="mqar lm" (default) names the steps to run, e.g. PARTS=lm.
# SCALE=gpu (the _gpu presets), SWEEP=<dir> (the lm runs go to ${SWEEP}_lm), REFRESH=1 (copy the reports of PARTS into
# this folder): ../study.sh.
set -euo pipefail
STUDY=length_extrapolation
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
PARTS=" ${PARTS:-mqar lm} "
START=$SECONDS

# screens PRESET DIR METRIC [OVERRIDES]: the two positional encodings as two parallel streams, each PRESET's
# learning-rate screen extended by one round where a cell's selected rate is at an edge of its grid (DIR/rope, DIR/none,
# their logs beside them); each configuration is 3 vmapped seeds, so the screen's runs are the compared cells.
screens() {
  local preset="$1" dir="$2" metric="$3" pos pids=()
  shift 3
  mkdir -p "$dir"
  for pos in rope none; do
    bracket_screen "$dir/$pos" normalizer 1 --metrics val/loss "$metric" -- \
      "experiment=$preset$SUFFIX" "model.positional=$pos" "$@" > "$dir/$pos.log" 2>&1 &
    pids+=("$!")
  done
  for pid in "${pids[@]}"; do wait "$pid"; done  # a failed stream stops the study here (set -e)
}

# copy_screens DIR NAME: each encoding's screen report and records into this folder as NAME_<pos>.md.
copy_screens() {
  local pos
  for pos in rope none; do
    cp "$1/$pos/report/report.md" "$HERE/$2_$pos.md"
    cp "$1/$pos/report/report.records.json.xz" "$HERE/$2_$pos.records.json.xz"
  done
}

if [[ "$PARTS" == *" mqar "* ]]; then
screens length_extrapolation/screen "$SWEEP" test/accuracy "$@"  # 1e-3, 3e-3
# Each normalizer at its own selected rate (val/loss), paired against softmax at the same positional encoding;
# formed: MQAR learned at the training length (test accuracy >= 0.9 on each seed; the plateau of a model that knows only
# that the answer is one of the 4 values is ~0.27), the condition for a length comparison to be tested.
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by model.positional normalizer --select-lr \
  --select-by val/loss --metrics test/accuracy test_len/512/accuracy test/loss --baseline normalizer=softmax \
  --formed 'test/accuracy>=0.9' --curves val/accuracy --records "$SWEEP/report/report.records.json.xz"
if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/report.records.json.xz" "$SWEEP/report/"*.png "$HERE/"
  copy_screens "$SWEEP" lr_screen
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
fi

# lm: 64-byte windows, 400 steps; each test length holds the same 32,000 predicted bytes (n_test auto).
if [[ "$PARTS" == *" lm "* ]]; then
LM_SWEEP="${SWEEP}_lm"
screens length_extrapolation/lm_screen "$LM_SWEEP" test/bits_per_byte "$@"  # 3e-3, 1e-2, 3e-2
# formed: language learned beyond a byte bigram at the training length (test bits per byte below the training text's
# byte bigram conditional entropy, 3.5301 — the lm task's bits_per_byte_bigram baseline — on each seed): a model that
# uses no more than the previous byte has no context length to extrapolate.
nice -n 10 "$BIN/attnlab-report" "$LM_SWEEP" --group-by model.positional normalizer --select-lr \
  --select-by val/loss --metrics test/bits_per_byte test_len/1024/bits_per_byte test/loss --baseline normalizer=softmax \
  --formed 'test/bits_per_byte<3.5301' --curves val/bits_per_byte --records "$LM_SWEEP/report/report.records.json.xz"
if [ "$REFRESH" = 1 ]; then
  cp "$LM_SWEEP/report/report.md" "$HERE/lm_report.md"
  cp "$LM_SWEEP/report/report.records.json.xz" "$HERE/lm_report.records.json.xz"
  for png in "$LM_SWEEP/report/"*.png; do cp "$png" "$HERE/lm_$(basename "$png")"; done
  copy_screens "$LM_SWEEP" lm_lr_screen
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/lm_*.png
fi
fi

times  # CPU time: the second line is the runs' user and system time
echo "length_extrapolation: wall time $((SECONDS - START)) s"
