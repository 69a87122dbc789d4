#!/usr/bin/env bash
# length_extrapolation: MQAR trained at 32 tokens and tested at 32 … 512 (1–16×, the same 4 key-value pairs in a
# longer context), 3 vmapped seeds per configuration, each normalizer at the rate normalizer_ablation's screen
# selected for it (softmax, sigmoid 3e-3; linear 1e-2); ssmax and stick-breaking, absent from that screen, at
# softmax's 3e-3 (screened afterwards: see README). RoPE and no positional encoding: softmax, ssmax,
# stick-breaking, sigmoid, linear.
# The two positional settings run as two parallel streams.
# lm step: byte-level lm trained at 64 bytes and tested at 64 … 1024 (1–16×), softmax, ssmax and stick-breaking with
# RoPE and with no positional encoding, 3 vmapped seeds, all at softmax's rate in lm_normalizers' screen (1e-2).
# Usage: bash experiments/length_extrapolation/run.sh [extra Hydra overrides, appended to every run]
# SWEEP=<dir> moves the sweep (default runs/length_extrapolation, git-ignored; the lm runs go to ${SWEEP}_lm);
# COPY=0 keeps the study folder untouched; PARTS="mqar lm lm_screen" (default) names the steps
# to run, e.g. PARTS=lm (lm_screen reads the lm step's runs).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
SWEEP="${SWEEP:-$ROOT/runs/length_extrapolation}"
COPY="${COPY:-1}"
PARTS=" ${PARTS:-mqar lm lm_screen} "
EXTRA=("$@")
START=$SECONDS
COMMON=(task=mqar task.seq_len=32 task.n_test=200 "task.test_lengths=[32,64,128,256,512]" model=small
  trainer.steps=500 trainer.batch_size=32 trainer.eval_every=250 trainer.vmap_seeds=3 trainer.progress=none)

if [[ "$PARTS" == *" mqar "* ]]; then
mkdir -p "$SWEEP"
(
  nice -n 10 "$BIN/attnlab-train" -m normalizer=softmax,stickbreaking,ssmax model.positional=rope optim.lr=3e-3 \
    "${COMMON[@]}" "hydra.sweep.dir=$SWEEP/rope" ${EXTRA[@]+"${EXTRA[@]}"}
  nice -n 10 "$BIN/attnlab-train" -m normalizer=sigmoid model.positional=rope optim.lr=3e-3 \
    "${COMMON[@]}" "hydra.sweep.dir=$SWEEP/rope_sigmoid" ${EXTRA[@]+"${EXTRA[@]}"}
  nice -n 10 "$BIN/attnlab-train" -m normalizer=linear model.positional=rope optim.lr=1e-2 \
    "${COMMON[@]}" "hydra.sweep.dir=$SWEEP/rope_linear" ${EXTRA[@]+"${EXTRA[@]}"}
) > "$SWEEP/rope.log" 2>&1 &
nice -n 10 "$BIN/attnlab-train" -m normalizer=stickbreaking,softmax,ssmax model.positional=none optim.lr=3e-3 \
  "${COMMON[@]}" "hydra.sweep.dir=$SWEEP/none" ${EXTRA[@]+"${EXTRA[@]}"} > "$SWEEP/none.log" 2>&1
nice -n 10 "$BIN/attnlab-train" -m normalizer=sigmoid model.positional=none optim.lr=3e-3 \
  "${COMMON[@]}" "hydra.sweep.dir=$SWEEP/none_sigmoid" ${EXTRA[@]+"${EXTRA[@]}"} > "$SWEEP/none_sigmoid.log" 2>&1
nice -n 10 "$BIN/attnlab-train" -m normalizer=linear model.positional=none optim.lr=1e-2 \
  "${COMMON[@]}" "hydra.sweep.dir=$SWEEP/none_linear" ${EXTRA[@]+"${EXTRA[@]}"} > "$SWEEP/none_linear.log" 2>&1
# Longer (1500 steps): softmax and ssmax with RoPE, which had not left MQAR's plateau at 500 steps.
nice -n 10 "$BIN/attnlab-train" -m normalizer=softmax,ssmax model.positional=rope optim.lr=3e-3 \
  "${COMMON[@]}" trainer.steps=1500 "hydra.sweep.dir=$SWEEP/rope_long" ${EXTRA[@]+"${EXTRA[@]}"} > "$SWEEP/long.log" 2>&1
wait
# A learning-rate screen with RoPE at 500 steps: 1e-3 and 1e-2 beside the 3e-3 runs above (linear left out), in a
# folder of its own (beside $SWEEP, so the main report's cells keep one rate), reported with the 3e-3 runs copied in.
SCREEN="${SWEEP}_lr_screen"
mkdir -p "$SCREEN"
nice -n 10 "$BIN/attnlab-train" -m normalizer=softmax,ssmax,stickbreaking,sigmoid model.positional=rope \
  optim.lr=1e-2,1e-3 "${COMMON[@]}" "hydra.sweep.dir=$SCREEN/rope_screen" ${EXTRA[@]+"${EXTRA[@]}"} > "$SCREEN/screen.log" 2>&1
rm -rf "$SCREEN/rope" "$SCREEN/rope_sigmoid"
cp -r "$SWEEP/rope" "$SWEEP/rope_sigmoid" "$SCREEN/"
rm -rf "$SCREEN/rope/report" "$SCREEN/rope_sigmoid/report"
nice -n 10 "$BIN/attnlab-report" "$SCREEN" --group-by normalizer --select-lr --metrics test/accuracy val/loss
# The same screen at 1500 steps for softmax and ssmax (RoPE): 1e-3 and 1e-2 beside the 3e-3 runs of rope_long.
LONG="${SWEEP}_long_lr_screen"
mkdir -p "$LONG"
nice -n 10 "$BIN/attnlab-train" -m normalizer=softmax,ssmax model.positional=rope optim.lr=1e-2,1e-3 \
  "${COMMON[@]}" trainer.steps=1500 "hydra.sweep.dir=$LONG/rope_long_screen" ${EXTRA[@]+"${EXTRA[@]}"} > "$LONG/screen.log" 2>&1
rm -rf "$LONG/rope_long"
cp -r "$SWEEP/rope_long" "$LONG/"
rm -rf "$LONG/rope_long/report"
nice -n 10 "$BIN/attnlab-report" "$LONG" --group-by normalizer --select-lr \
  --metrics test/accuracy test_len/512/accuracy val/loss --baseline normalizer=softmax
# The screen without positions (500 steps): 1e-3 and 1e-2 beside the 3e-3 runs (linear: 1e-3 and 3e-3 beside 1e-2).
NONE="${SWEEP}_none_lr_screen"
mkdir -p "$NONE"
nice -n 10 "$BIN/attnlab-train" -m normalizer=softmax,ssmax,sigmoid,stickbreaking model.positional=none \
  optim.lr=1e-2,1e-3 "${COMMON[@]}" "hydra.sweep.dir=$NONE/none_screen" ${EXTRA[@]+"${EXTRA[@]}"} > "$NONE/screen.log" 2>&1
nice -n 10 "$BIN/attnlab-train" -m normalizer=linear model.positional=none optim.lr=1e-3,3e-3 "${COMMON[@]}" \
  "hydra.sweep.dir=$NONE/none_linear_screen" ${EXTRA[@]+"${EXTRA[@]}"} > "$NONE/linear_screen.log" 2>&1
rm -rf "$NONE/none" "$NONE/none_sigmoid" "$NONE/none_linear"
cp -r "$SWEEP/none" "$SWEEP/none_sigmoid" "$SWEEP/none_linear" "$NONE/"
rm -rf "$NONE/none/report" "$NONE/none_sigmoid/report" "$NONE/none_linear/report"
nice -n 10 "$BIN/attnlab-report" "$NONE" --group-by normalizer --select-lr --metrics test/accuracy val/loss

nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by model.positional normalizer trainer.steps \
  --metrics test/accuracy test/loss --baseline normalizer=softmax --curves val/accuracy

if [ "$COPY" = 1 ]; then
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
LM_COMMON=(task=lm task.seq_len=64 "task.test_lengths=[64,128,256,512,1024]" model=small trainer.steps=400
  trainer.eval_every=50 trainer.vmap_seeds=3 trainer.progress=none)
if [[ "$PARTS" == *" lm "* ]]; then
LM_SWEEP="${SWEEP}_lm"
mkdir -p "$LM_SWEEP"
nice -n 10 "$BIN/attnlab-train" -m normalizer=stickbreaking,softmax,ssmax model.positional=none optim.lr=1e-2 \
  "${LM_COMMON[@]}" "hydra.sweep.dir=$LM_SWEEP/none" ${EXTRA[@]+"${EXTRA[@]}"} > "$LM_SWEEP/none.log" 2>&1
nice -n 10 "$BIN/attnlab-train" -m normalizer=softmax,ssmax,stickbreaking model.positional=rope optim.lr=1e-2 \
  "${LM_COMMON[@]}" "hydra.sweep.dir=$LM_SWEEP/rope" ${EXTRA[@]+"${EXTRA[@]}"} > "$LM_SWEEP/rope.log" 2>&1
nice -n 10 "$BIN/attnlab-report" "$LM_SWEEP" --group-by model.positional normalizer \
  --metrics test/bits_per_byte test/loss --baseline normalizer=softmax --curves val/bits_per_byte
if [ "$COPY" = 1 ]; then
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
nice -n 10 "$BIN/attnlab-train" -m normalizer=stickbreaking,ssmax,softmax model.positional=none \
  "${LM_COMMON[@]}" optim.lr=3e-2 "hydra.sweep.dir=$LM_SCREEN/none_3e-2" ${EXTRA[@]+"${EXTRA[@]}"} > "$LM_SCREEN/screen.log" 2>&1
rm -rf "$LM_SCREEN/none"
cp -r "${SWEEP}_lm/none" "$LM_SCREEN/"
rm -rf "$LM_SCREEN/none/report"
nice -n 10 "$BIN/attnlab-report" "$LM_SCREEN" --group-by normalizer --select-lr --metrics test/bits_per_byte val/loss
[ "$COPY" = 1 ] && cp "$LM_SCREEN/report/report.md" "$HERE/lm_lr_screen.md"
fi
times  # CPU time: the second line is the runs' user and system time
echo "length_extrapolation: wall time $((SECONDS - START)) s"
