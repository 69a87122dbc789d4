#!/usr/bin/env bash
# entropy_collapse: softmax attention at the default and at a high learning rate, with and without QK-norm
# (Zhai et al. 2023 entropy collapse; Wortsman et al. 2023 attention-logit growth; Henry et al. 2020 QK-norm), on MQAR.
# Usage: bash experiments/entropy_collapse/run.sh [extra Hydra overrides, e.g. model=base accelerator=gpu trainer.steps=5000]
# SWEEP=<dir> moves the sweep (default runs/entropy_collapse, git-ignored); COPY=0 keeps the study folder untouched.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
SWEEP="${SWEEP:-$ROOT/runs/entropy_collapse}"
COPY="${COPY:-1}"
START=$SECONDS

nice -n 10 "$BIN/attnlab-train" -m task=mqar normalizer=softmax optim.lr=3e-3,3e-2 model.qk_norm=false,true \
  model=small trainer.steps=400 trainer.log_every=20 trainer.eval_every=100 trainer.vmap_seeds=2 trainer.progress=none \
  trainer.nonfinite=skip "hydra.sweep.dir=$SWEEP" "$@"
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by optim.lr model.qk_norm \
  --metrics test/accuracy test/loss \
  --baseline model.qk_norm=false \
  --curves attn_entropy/layer_0/head_0 attn_entropy/layer_1/head_0 attn_max_logit/layer_0/head_0 attn_max_logit/layer_1/head_0 grad_norm/global val/accuracy
nice -n 10 "$BIN/python" "$HERE/summarize.py" "$SWEEP" > "$SWEEP/report/collapse.md"

if [ "$COPY" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/collapse.md" "$HERE/"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
echo "entropy_collapse: wall time $((SECONDS - START)) s"
