#!/usr/bin/env bash
# squared_instability: p²/(Σp² + eps) attention (seed 004: "much more unstable, as the denominator might get to 0")
# at a higher learning rate, eps ∈ {1e-2, 1e-6, 0} × offset ∈ {false, true}, non-finite updates skipped and counted.
# Usage: bash experiments/squared_instability/run.sh [extra Hydra overrides, e.g. model=base accelerator=gpu trainer.steps=5000]
# SWEEP=<dir> moves the sweep (default runs/squared_instability, git-ignored); COPY=0 keeps the study folder untouched.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
SWEEP="${SWEEP:-$ROOT/runs/squared_instability}"
COPY="${COPY:-1}"
START=$SECONDS

nice -n 10 "$BIN/attnlab-train" -m task=mqar normalizer=squared normalizer.eps=1e-2,1e-6,0 normalizer.offset=false,true \
  optim.lr=1e-2 trainer.nonfinite=skip \
  model=small trainer.steps=300 trainer.log_every=10 trainer.eval_every=100 trainer.vmap_seeds=3 trainer.progress=none \
  "hydra.sweep.dir=$SWEEP" "$@"
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by normalizer.eps normalizer.offset \
  --metrics test/accuracy test/loss \
  --baseline normalizer.eps=1e-2 \
  --curves attn_min_denominator/layer_0/head_0 attn_min_denominator/layer_1/head_0 grad_norm/global score_grad/layer_0 train/nonfinite_steps train/loss
nice -n 10 "$BIN/python" "$HERE/summarize.py" "$SWEEP" > "$SWEEP/report/instability.md"

if [ "$COPY" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/instability.md" "$HERE/"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
echo "squared_instability: wall time $((SECONDS - START)) s"
