#!/usr/bin/env bash
# squared_instability: p²/(Σp² + eps) attention (seed 004: "much more unstable, as the denominator might get to 0")
# at a higher learning rate, eps ∈ {1e-2, 1e-6, 0} × offset ∈ {false, true}, non-finite updates skipped and counted.
# On MQAR, then on language modelling (lm_normalizers' BPE setting), where squared attention learns. The sweeps are the
# presets configs/experiment/squared_instability.yaml (`attnlab-train -m experiment=squared_instability`) and
# squared_instability/lm.yaml; this script adds their reports and summarize.py's instability tables, into
# $SWEEP/report and ${SWEEP}_lm/report (the lm report's records beside it).
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
  --curves attn_min_denominator/layer_0/head_0 attn_min_denominator/layer_1/head_0 grad_norm/global score_grad/layer_0 train/nonfinite_steps train/loss \
  --records "$SWEEP/report/report.records.json.xz"
nice -n 10 "$BIN/python" "$HERE/summarize.py" "$SWEEP" > "$SWEEP/report/instability.md"
LM_SWEEP="${SWEEP}_lm"
nice -n 10 "$BIN/attnlab-train" -m "experiment=squared_instability/lm$SUFFIX" "hydra.sweep.dir=$LM_SWEEP" "$@"
nice -n 10 "$BIN/attnlab-report" "$LM_SWEEP" --out "$LM_SWEEP/report" --group-by normalizer.eps normalizer.offset \
  --metrics test/bits_per_byte test/accuracy --baseline normalizer.eps=1e-2 \
  --curves attn_min_denominator/layer_0/head_0 attn_min_denominator/layer_1/head_0 grad_norm/global val/bits_per_byte \
  --log-y 'attn_min_denominator/*' --records "$LM_SWEEP/report/report.records.json.xz"
nice -n 10 "$BIN/python" "$HERE/summarize.py" "$LM_SWEEP" > "$LM_SWEEP/report/instability.md"

if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/instability.md" "$HERE/"
  cp "$SWEEP/report/report.records.json.xz" "$HERE/"
  cp "$LM_SWEEP/report/report.md" "$HERE/lm_report.md"
  cp "$LM_SWEEP/report/report.records.json.xz" "$HERE/lm_report.records.json.xz"
  cp "$LM_SWEEP/report/instability.md" "$HERE/lm_instability.md"
  for png in "$LM_SWEEP/report/"*.png; do cp "$png" "$HERE/lm_$(basename "$png")"; done
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
echo "squared_instability: wall time $((SECONDS - START)) s"
