#!/usr/bin/env bash
# squared_instability: p²/(Σp² + eps) attention (seed 004: "much more unstable, as the denominator might get to 0")
# at a higher learning rate, eps ∈ {1e-2, 1e-6, 0} × offset ∈ {false, true}, non-finite updates skipped and counted.
# The sweep is the preset configs/experiment/squared_instability.yaml
# (`attnlab-train -m experiment=squared_instability`); this script adds the report and summarize.py's
# instability.md, into $SWEEP/report.
# Usage: bash experiments/squared_instability/run.sh [extra Hydra overrides]
# SCALE=gpu (the squared_instability_gpu preset), SWEEP=<dir>, REFRESH=1 (copy the report into this folder): ../study.sh.
set -euo pipefail
STUDY=squared_instability
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
START=$SECONDS

nice -n 10 "$BIN/attnlab-train" -m "experiment=squared_instability$SUFFIX" "hydra.sweep.dir=$SWEEP" "$@"
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by normalizer.eps normalizer.offset \
  --metrics test/accuracy test/loss \
  --baseline normalizer.eps=1e-2 \
  --curves attn_min_denominator/layer_0/head_0 attn_min_denominator/layer_1/head_0 grad_norm/global score_grad/layer_0 train/nonfinite_steps train/loss
nice -n 10 "$BIN/python" "$HERE/summarize.py" "$SWEEP" > "$SWEEP/report/instability.md"

if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/instability.md" "$HERE/"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
echo "squared_instability: wall time $((SECONDS - START)) s"
