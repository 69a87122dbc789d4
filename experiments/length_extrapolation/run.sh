#!/usr/bin/env bash
# length_extrapolation: MQAR trained at 32 tokens and tested at 32 … 512 (1–16×, the same 4 key-value pairs in a
# longer context) for softmax, ssmax, stick-breaking, sigmoid and linear attention, with RoPE and with no positional
# encoding, 3 vmapped seeds each, each normalizer at the rate normalizer_ablation's screen selected for it
# (softmax, sigmoid 3e-3; linear 1e-2); ssmax and stick-breaking, absent from that screen, at softmax's 3e-3.
# Usage: bash experiments/length_extrapolation/run.sh [extra Hydra overrides, appended to every run]
# SWEEP=<dir> moves the sweep (default runs/length_extrapolation, git-ignored); COPY=0 keeps the study folder untouched.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
SWEEP="${SWEEP:-$ROOT/runs/length_extrapolation}"
COPY="${COPY:-1}"
EXTRA=("$@")
START=$SECONDS
COMMON=(task=mqar task.seq_len=32 task.n_test=200 "task.test_lengths=[32,64,128,256,512]"
  model=small model.positional=rope,none
  trainer.steps=800 trainer.eval_every=200 trainer.vmap_seeds=3 trainer.progress=none)

nice -n 10 "$BIN/attnlab-train" -m normalizer=stickbreaking,softmax,ssmax optim.lr=3e-3 "${COMMON[@]}" \
  "hydra.sweep.dir=$SWEEP/softmax_family" ${EXTRA[@]+"${EXTRA[@]}"}
nice -n 10 "$BIN/attnlab-train" -m normalizer=sigmoid optim.lr=3e-3 "${COMMON[@]}" \
  "hydra.sweep.dir=$SWEEP/sigmoid" ${EXTRA[@]+"${EXTRA[@]}"}
nice -n 10 "$BIN/attnlab-train" -m normalizer=linear optim.lr=1e-2 "${COMMON[@]}" \
  "hydra.sweep.dir=$SWEEP/linear" ${EXTRA[@]+"${EXTRA[@]}"}

nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by model.positional normalizer \
  --metrics test/accuracy test/loss --baseline normalizer=softmax --curves val/accuracy

if [ "$COPY" = 1 ]; then
  cp "$SWEEP/report/report.md" "$HERE/report.md"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
times  # CPU time: the second line is the runs' user and system time
echo "length_extrapolation: wall time $((SECONDS - START)) s"
