#!/usr/bin/env bash
# entropy_collapse: softmax attention at the default and at a high learning rate, with and without QK-norm
# (Zhai et al. 2023 entropy collapse; Wortsman et al. 2023 attention-logit growth; Henry et al. 2020 QK-norm), on MQAR,
# then on language modelling (lm_normalizers' BPE setting), where softmax learns at high rates.
# The sweeps are the presets configs/experiment/entropy_collapse.yaml (`attnlab-train -m experiment=entropy_collapse`)
# and entropy_collapse/lm.yaml; this script adds their reports and summarize.py's collapse tables, into $SWEEP/report
# and ${SWEEP}_lm/report (the lm report's records beside it).
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
  --curves attn_entropy/layer_0/head_0 attn_entropy/layer_1/head_0 attn_max_logit/layer_0/head_0 attn_max_logit/layer_1/head_0 grad_norm/global val/accuracy \
  --records "$SWEEP/report/report.records.json.xz"
nice -n 10 "$BIN/python" "$HERE/summarize.py" "$SWEEP" > "$SWEEP/report/collapse.md"
# The phenomenon on lm: layer 1's attention entropy (its mean over heads) collapsing during training, to at most 0.2
# (~0.3-0.45 at 3e-2), as Zhai et al. 2023 track it over training: it can recover by the end, so the condition is on
# the curve's minimum. Each cell against no QK-norm at its own rate.
LM_SWEEP="${SWEEP}_lm"
nice -n 10 "$BIN/attnlab-train" -m "experiment=entropy_collapse/lm$SUFFIX" "hydra.sweep.dir=$LM_SWEEP/pilot" "$@"
# seeds 1-2 (vmapped) at the rates where the pilot's logits grew
nice -n 10 "$BIN/attnlab-train" -m "experiment=entropy_collapse/lm$SUFFIX" seed=1 trainer.vmap_seeds=2 \
  optim.lr=1e-1,3e-1 "hydra.sweep.dir=$LM_SWEEP/seeds" "$@"
nice -n 10 "$BIN/attnlab-report" "$LM_SWEEP" --out "$LM_SWEEP/report" --group-by optim.lr model.qk_norm \
  --metrics test/bits_per_byte test/attn_entropy/layer_1 test/attn_max_weight/layer_1 \
  --baseline model.qk_norm=false --formed 'min(attn_entropy/layer_1)<=0.2' \
  --curves attn_max_logit/layer_1/head_0 attn_entropy/layer_1 val/bits_per_byte --log-y 'attn_max_logit/*' \
  --records "$LM_SWEEP/report/report.records.json.xz"
nice -n 10 "$BIN/python" "$HERE/summarize.py" "$LM_SWEEP" > "$LM_SWEEP/report/collapse.md"

if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/collapse.md" "$HERE/"
  cp "$SWEEP/report/report.records.json.xz" "$HERE/"
  cp "$LM_SWEEP/report/report.md" "$HERE/lm_report.md"
  cp "$LM_SWEEP/report/report.records.json.xz" "$HERE/lm_report.records.json.xz"
  cp "$LM_SWEEP/report/collapse.md" "$HERE/lm_collapse.md"
  for png in "$LM_SWEEP/report/"*.png; do cp "$png" "$HERE/lm_$(basename "$png")"; done
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
echo "entropy_collapse: wall time $((SECONDS - START)) s"
