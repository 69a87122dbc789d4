#!/usr/bin/env bash
# attention_sinks' first design again, at the rates its screens selected (lr_screen.md, lr_gated.md, lr_sgd.md,
# lr_deep.md, lr_lm_bos.md), seeds 0-2 vmapped per cell: report.md written with whether the softmax baseline formed
# the sink (dormant-row first-key weight >= 0.3 per seed, Gu et al. 2024's ε), lm_bos_report.md as run.sh writes it,
# each with its records, so that both regenerate on a fresh clone. The screens themselves are run.sh's; this reruns
# only the cells the two reports compare.
# Usage: bash experiments/attention_sinks/first_design.sh [extra Hydra overrides]; SWEEP, REFRESH as ../study.sh.
set -euo pipefail
STUDY=attention_sinks
SWEEP_NAME=attention_sinks_first
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
START=$SECONDS
FORMED="test/attn_dormant_first_weight/layer_0>=0.3"
# PRESET CELL LR: each cell of report.md at its selected rate
CELLS=(
  "screen normalizer=softmax 0.01"
  "screen normalizer=relu 0.01"
  "screen normalizer=softpick 0.0316"
  "screen normalizer=sink 0.01"
  "screen normalizer=softmax1 0.01"
  "screen normalizer=sigmoid 0.003"
  "screen normalizer=forgetting 0.01"
  "screen normalizer=differential 0.01"
  "screen_gated normalizer=softmax 0.01"
  "screen_sgd normalizer=softmax 1"
  "deep normalizer=softmax 0.01"
  "deep normalizer=relu 0.01"
  "lm_bos task.bos=false 0.01"
  "lm_bos task.bos=true 0.01"
)

for cell in "${CELLS[@]}"; do
  read -r preset choice lr <<< "$cell"
  case "$preset" in lm_bos) dir="$SWEEP/lm_bos/${choice#*=}" ;; *) dir="$SWEEP/bb/$preset/${choice#*=}" ;; esac
  run_finished "$dir" && continue  # finished before: a resumed study keeps it
  while [ "$(jobs -pr | wc -l)" -ge 2 ]; do wait -n; done
  mkdir -p "$(dirname "$dir")"
  nice -n 10 "$BIN/attnlab-train" "experiment=attention_sinks/$preset$SUFFIX" "$choice" "optim.lr=$lr" seed=0 \
    trainer.vmap_seeds=3 trainer.progress=none "hydra.run.dir=$dir" "$@" > "$dir.log" 2>&1 &
done
for job in $(jobs -p); do wait "$job"; done  # a failed run stops the study (set -e)

nice -n 10 "$BIN/attnlab-report" "$SWEEP/bb" --out "$SWEEP/report" \
  --group-by normalizer model.output_gate optim model.layers --select-lr --select-by val/loss \
  --baseline normalizer=softmax,model.output_gate=none,optim=adamw --formed "$FORMED" \
  --metrics test/loss test/dormant/loss test/trigger/accuracy test/attn_dormant_sink_rate \
  test/attn_dormant_first_weight/layer_0 test/attn_dormant_first_weight/layer_2 test/attn_value_drain/layer_0 \
  test/attn_value_drain/layer_2 test/attn_residual_peak/layer_0 test/attn_residual_peak/layer_2 \
  test/attn_self_weight/layer_0 test/attn_row_mass/layer_0 test/attn_massive_ratio/layer_0 \
  --curves val/dormant/loss attn_first_weight/layer_0 attn_value_drain/layer_0 attn_residual_peak/layer_0 \
  --records "$SWEEP/report.records.json.xz" > "$SWEEP/report.log"

nice -n 10 "$BIN/attnlab-report" "$SWEEP/lm_bos" --out "$SWEEP/lm_bos_report" --group-by task.bos \
  --baseline task.bos=false \
  --metrics test/bits_per_byte test/attn_first_weight/layer_0 test/attn_first_weight/layer_1 test/attn_sink_rate \
  test/attn_value_drain/layer_0 test/attn_value_drain/layer_1 test/attn_residual_peak/layer_1 \
  --curves val/bits_per_byte attn_first_weight/layer_1 \
  --records "$SWEEP/lm_bos_report.records.json.xz" > "$SWEEP/lm_bos_report.log"

if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$HERE/report.md"
  cp "$SWEEP/lm_bos_report/report.md" "$HERE/lm_bos_report.md"
  cp "$SWEEP/lm_bos_report.records.json.xz" "$HERE/lm_bos_report.records.json.xz"
  cp "$SWEEP/lm_bos_report/"*.png "$HERE/"  # names of their own (bits per byte, layer 1): lm_bos_report.md's links
  cp "$SWEEP/report.records.json.xz" "$HERE/report.records.json.xz"
  for png in "$SWEEP/report/"*.png; do cp "$png" "$HERE/"; done
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/curve_*.png
fi
times  # CPU time: the second line is the runs' user and system time
echo "attention_sinks first design: wall time $((SECONDS - START)) s"
