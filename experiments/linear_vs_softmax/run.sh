#!/usr/bin/env bash
# linear_vs_softmax: the accuracy cost of linear attention as MQAR's number of key-value pairs grows
# (seed 004's comment: linear attention solves the O(n²) problem — at what price in recall?).
# The cost against sequence length is measured separately: scripts/bench_attention.py, results in BENCHMARKS.md.
# Usage: bash experiments/linear_vs_softmax/run.sh [extra Hydra overrides, e.g. model=base accelerator=gpu trainer.steps=5000]
# SWEEP=<dir> moves the sweep (default runs/linear_vs_softmax, git-ignored); COPY=0 keeps the study folder untouched.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
SWEEP="${SWEEP:-$ROOT/runs/linear_vs_softmax}"
COPY="${COPY:-1}"
START=$SECONDS

# seq_len 64 holds up to 16 pairs (4·pairs ≤ seq_len); vocab 64 gives 31 distinct keys.
nice -n 10 "$BIN/attnlab-train" -m task=mqar task.num_kv_pairs=2,4,8 task.seq_len=64 normalizer=softmax,linear \
  model=small trainer.steps=800 trainer.eval_every=100 trainer.vmap_seeds=2 trainer.progress=none \
  "hydra.sweep.dir=$SWEEP" "$@"
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by task.num_kv_pairs normalizer \
  --metrics test/accuracy test/loss \
  --baseline normalizer=softmax \
  --curves val/accuracy train/loss

if [ "$COPY" = 1 ]; then
  cp "$SWEEP/report/report.md" "$HERE/report.md"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
echo "linear_vs_softmax: wall time $((SECONDS - START)) s"
