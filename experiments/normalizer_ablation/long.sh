#!/usr/bin/env bash
# normalizer_ablation, past the transition: the normalizers that sat on the MQAR plateau at 800 steps, run for 2000
# steps at the rate where the history's 1-seed supplement saw them leave it (ReLU 3e-3, sigmoid 1e-3), 3 vmapped seeds.
# 1.5-entmax (3e-3) is left out for cost (~3x a ReLU step); add it with: bash long.sh normalizer=relu,entmax ...
# Usage: bash experiments/normalizer_ablation/long.sh [extra Hydra overrides]; SWEEP=<dir> (default runs/normalizer_ablation_long).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
SWEEP="${SWEEP:-$ROOT/runs/normalizer_ablation_long}"
COPY="${COPY:-1}"
START=$SECONDS
COMMON=(task=mqar model=small trainer.steps=2000 trainer.eval_every=250 trainer.vmap_seeds=3 trainer.progress=none)
nice -n 10 "$BIN/attnlab-train" normalizer=relu optim.lr=3e-3 "${COMMON[@]}" "hydra.run.dir=$SWEEP/relu" "$@"
nice -n 10 "$BIN/attnlab-train" normalizer=sigmoid optim.lr=1e-3 "${COMMON[@]}" "hydra.run.dir=$SWEEP/sigmoid" "$@"
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by normalizer optim.lr --metrics test/accuracy test/loss \
  --curves val/accuracy
if [ "$COPY" = 1 ]; then
  cp "$SWEEP/report/report.md" "$HERE/long.md"
  cp "$SWEEP/report/curve_val_accuracy.png" "$HERE/long_curve_val_accuracy.png"
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE/long_curve_val_accuracy.png"
fi
times  # CPU time: the second line is the runs' user and system time
echo "normalizer_ablation long: wall time $((SECONDS - START)) s"
