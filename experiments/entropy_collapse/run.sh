#!/usr/bin/env bash
# entropy_collapse: softmax attention at the default and at a high learning rate, with and without QK-norm
# (Zhai et al. 2023 entropy collapse; Wortsman et al. 2023 attention-logit growth; Henry et al. 2020 QK-norm), on MQAR.
# The sweep is the preset configs/experiment/entropy_collapse.yaml (`attnlab-train -m experiment=entropy_collapse`);
# this script adds the report and summarize.py's collapse.md, into $SWEEP/report.
# Usage: bash experiments/entropy_collapse/run.sh [extra Hydra overrides]
# SCALE=gpu (the entropy_collapse_gpu preset), SWEEP=<dir>, REFRESH=1 (copy the report into this folder): ../study.sh.
set -euo pipefail
STUDY=entropy_collapse
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
START=$SECONDS

nice -n 10 "$BIN/attnlab-train" -m "experiment=entropy_collapse$SUFFIX" "hydra.sweep.dir=$SWEEP" "$@"
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by optim.lr model.qk_norm \
  --metrics test/accuracy test/loss \
  --baseline model.qk_norm=false \
  --curves attn_entropy/layer_0/head_0 attn_entropy/layer_1/head_0 attn_max_logit/layer_0/head_0 attn_max_logit/layer_1/head_0 grad_norm/global val/accuracy
nice -n 10 "$BIN/python" "$HERE/summarize.py" "$SWEEP" > "$SWEEP/report/collapse.md"

if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/collapse.md" "$HERE/"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
echo "entropy_collapse: wall time $((SECONDS - START)) s"
