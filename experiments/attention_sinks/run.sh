#!/usr/bin/env bash
# attention_sinks: does a normalizer or gate remove the attention sink? Byte-level language modelling (task=lm) with
# softmax, softmax1, sigmoid, ReLU, softpick, a learnable sink logit, forgetting attention (FoX), differential
# attention and gated attention (softmax with model.output_gate=headwise), each at its own learning rate, in two
# stages (as lm_normalizers):
#  1. screen: 3 rates spanning 10x (1e-3, 3e-3, 1e-2), seed 0 (screen.yaml; gated attention screen_gated.yaml);
#     the rate is selected per cell on validation loss (attnlab-report --select-lr);
#  2. confirm: seeds 1 and 2 (vmapped) at each cell's selected rate, so the reported cell has 3 seeds.
# Reported: test bits per byte beside the sink rate over heads at eps = 0.3 (Gu et al. 2024), the first-key weight
# per layer, the residual stream's largest |activation| over its median and its kurtosis per layer, and the curves
# of the sink rate over training.
# Usage: bash experiments/attention_sinks/run.sh [extra Hydra overrides, appended to every run; normalizer= and
#   optim.lr= reach the screen only, the confirm stage takes the screen's selection]
# SCALE=gpu (the _gpu presets), SWEEP=<dir> (default runs/attention_sinks), REFRESH=1 (copy the reports into this
# folder): ../study.sh.
set -euo pipefail
STUDY=attention_sinks
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
START=$SECONDS
CONFIRM_EXTRA=()  # the extra overrides but the screen's own keys, whose values the screen selects
for override in "$@"; do
  case "$override" in normalizer=* | optim.lr=*) ;; *) CONFIRM_EXTRA+=("$override") ;; esac
done

nice -n 10 "$BIN/attnlab-train" -m "experiment=attention_sinks/screen$SUFFIX" "hydra.sweep.dir=$SWEEP/screen" "$@"
nice -n 10 "$BIN/attnlab-train" -m "experiment=attention_sinks/screen_gated$SUFFIX" \
  "hydra.sweep.dir=$SWEEP/screen_gated" "$@"
for part in screen screen_gated; do
  nice -n 10 "$BIN/attnlab-report" "$SWEEP/$part" --group-by normalizer --select-lr --select-by val/loss \
    --metrics val/loss val/bits_per_byte
done
while read -r norm lr; do
  nice -n 10 "$BIN/attnlab-train" "experiment=attention_sinks/confirm$SUFFIX" "$norm" "$lr" \
    "hydra.run.dir=$SWEEP/confirm/${norm#normalizer=}" ${CONFIRM_EXTRA[@]+"${CONFIRM_EXTRA[@]}"}
done < <("$BIN/python" "$ROOT/experiments/selected_lrs.py" "$SWEEP/screen/report/report.csv" normalizer)
while read -r norm lr; do
  nice -n 10 "$BIN/attnlab-train" "experiment=attention_sinks/confirm$SUFFIX" "$norm" "$lr" \
    model.output_gate=headwise "hydra.run.dir=$SWEEP/confirm/gated" ${CONFIRM_EXTRA[@]+"${CONFIRM_EXTRA[@]}"}
done < <("$BIN/python" "$ROOT/experiments/selected_lrs.py" "$SWEEP/screen_gated/report/report.csv" normalizer)

nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by normalizer model.output_gate --select-lr --select-by val/loss \
  --metrics test/bits_per_byte test/attn_sink_rate test/attn_first_weight/layer_0 test/attn_first_weight/layer_1 \
  test/attn_massive_ratio/layer_0 test/attn_massive_ratio/layer_1 test/attn_kurtosis/layer_0 \
  test/attn_kurtosis/layer_1 \
  --baseline normalizer=softmax \
  --curves val/bits_per_byte attn_sink_rate attn_first_weight/layer_0 attn_first_weight/layer_1 \
  attn_massive_ratio/layer_1 attn_kurtosis/layer_1 --log-y 'attn_massive_ratio/*' 'attn_kurtosis/*'

if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$HERE/"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
times  # CPU time: the second line is the runs' user and system time
echo "attention_sinks: wall time $((SECONDS - START)) s"
