#!/usr/bin/env bash
# attention_sinks: does a normalizer, a gate or the optimizer remove the attention sink where one forms? Bigram-Backcopy
# (Guo et al. 2024), whose dormant rows need somewhere to park: one layer with softmax, ReLU, softpick, a learnable
# sink logit, softmax with a head-wise output gate (Qiu et al. 2025) and softmax under SGD; byte-level
# language modelling with and without a beginning of sequence (task.bos). Every cell trains seed 0 at each rate of
# its grid; the rate is selected per cell on validation loss, and a grid whose selected rate is at an edge is extended
# one rate beyond it, at most LIMIT times (study.sh's bracket_screen); then seeds 1 and 2 (vmapped) at the selected
# rate (confirm), so each cell has 3 seeds; the final reports select again over both stages on validation loss.
# Reported: test loss, the dormant rows' loss (Bayes-optimal: the chain's own), the copy accuracy on trigger rows, the
# first-key weight on dormant rows and its sink rate (ε = 0.3, Gu et al. 2024), the first token's value drain and
# residual peak (Guo et al. 2024), the residual max/median (Sun et al. 2024), and curves over training.
# Usage: bash experiments/attention_sinks/run.sh [extra Hydra overrides, appended to every run]
# SCALE=gpu (the _gpu presets), SWEEP=<dir> (default runs/attention_sinks), REFRESH=1 (copy the reports into this
# folder): ../study.sh.
set -euo pipefail
STUDY=attention_sinks
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
START=$SECONDS
LIMIT=2  # extensions of a grid beyond an edge, one rate each
CONFIRM_EXTRA=()  # the extra overrides but a sweep's launcher: the confirm runs are single runs
for override in "$@"; do
  case "$override" in hydra/launcher=* | hydra.launcher.*) ;; *) CONFIRM_EXTRA+=("$override") ;; esac
done

# confirm PRESET DIR KEY: seeds 1 and 2 (vmapped) at each cell's selected rate (DIR/report/report.csv), two at a time
confirm() {
  local preset="$1" dir="$2" key="$3" cell lr
  while read -r cell lr; do
    run_finished "$dir/confirm/${cell#*=}" && continue  # finished before: a resumed study keeps it
    while [ "$(jobs -pr | wc -l)" -ge 2 ]; do wait -n; done
    nice -n 10 "$BIN/attnlab-train" "experiment=$preset" "$cell" "$lr" seed=1 trainer.vmap_seeds=2 \
      "hydra.run.dir=$dir/confirm/${cell#*=}" ${CONFIRM_EXTRA[@]+"${CONFIRM_EXTRA[@]}"} &
  done < <("$BIN/python" "$ROOT/experiments/selected_lrs.py" "$dir/report/report.csv" "$key")
  wait
}

bracket_screen "$SWEEP/bb/screen" normalizer "$LIMIT" --metrics val/loss -- "experiment=attention_sinks/screen$SUFFIX" "$@"
confirm "attention_sinks/screen$SUFFIX" "$SWEEP/bb/screen" normalizer
bracket_screen "$SWEEP/bb/gated" normalizer "$LIMIT" --metrics val/loss -- \
  "experiment=attention_sinks/screen_gated$SUFFIX" "$@"
confirm "attention_sinks/screen_gated$SUFFIX" "$SWEEP/bb/gated" normalizer
bracket_screen "$SWEEP/bb/sgd" normalizer "$LIMIT" --metrics val/loss -- "experiment=attention_sinks/screen_sgd$SUFFIX" "$@"
confirm "attention_sinks/screen_sgd$SUFFIX" "$SWEEP/bb/sgd" normalizer
bracket_screen "$SWEEP/lm_bos" task.bos "$LIMIT" --metrics val/loss val/bits_per_byte -- \
  "experiment=attention_sinks/lm_bos$SUFFIX" "$@"
confirm "attention_sinks/lm_bos$SUFFIX" "$SWEEP/lm_bos" task.bos
# three layers, softmax and ReLU: last, the stage two shared cores finish last
bracket_screen "$SWEEP/bb/deep" normalizer "$LIMIT" --metrics val/loss -- "experiment=attention_sinks/deep$SUFFIX" "$@"
confirm "attention_sinks/deep$SUFFIX" "$SWEEP/bb/deep" normalizer

# The final reports read each cell's runs at its selected rate alone (selected_runs.py): re-selecting over every rate
# would weigh the screen's one seed against the selected rate's three.
for part in screen gated sgd deep; do
  "$BIN/python" "$ROOT/experiments/selected_runs.py" "$SWEEP/bb/$part/report/report.csv" normalizer "$SWEEP/bb/$part" \
    "$SWEEP/final/bb/$part"
done
"$BIN/python" "$ROOT/experiments/selected_runs.py" "$SWEEP/lm_bos/report/report.csv" task.bos "$SWEEP/lm_bos" \
  "$SWEEP/final/lm_bos"
nice -n 10 "$BIN/attnlab-report" "$SWEEP/final/bb" --out "$SWEEP/bb/report" \
  --group-by normalizer model.output_gate optim model.layers \
  $(lr_flag normalizer "$SWEEP"/bb/{screen,gated,sgd,deep}/report/report.csv) --select-by val/loss \
  --baseline normalizer=softmax,model.output_gate=none,optim=adamw \
  --metrics test/loss test/dormant/loss test/trigger/accuracy test/attn_dormant_sink_rate \
  test/attn_dormant_first_weight/layer_0 test/attn_dormant_first_weight/layer_2 test/attn_value_drain/layer_0 \
  test/attn_value_drain/layer_2 test/attn_residual_peak/layer_0 test/attn_residual_peak/layer_2 \
  test/attn_self_weight/layer_0 test/attn_row_mass/layer_0 test/attn_massive_ratio/layer_0 \
  --curves val/dormant/loss attn_first_weight/layer_0 attn_value_drain/layer_0 attn_residual_peak/layer_0
nice -n 10 "$BIN/attnlab-report" "$SWEEP/final/lm_bos" --out "$SWEEP/lm_bos/final_report" --group-by task.bos \
  $(lr_flag task.bos "$SWEEP/lm_bos/report/report.csv") --select-by val/loss --baseline task.bos=false \
  --metrics test/bits_per_byte test/attn_first_weight/layer_0 test/attn_first_weight/layer_1 test/attn_sink_rate \
  test/attn_value_drain/layer_0 test/attn_value_drain/layer_1 test/attn_residual_peak/layer_1 \
  --curves val/bits_per_byte attn_first_weight/layer_1

if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/bb/report/report.md" "$HERE/report.md"
  cp "$SWEEP/lm_bos/final_report/report.md" "$HERE/lm_bos_report.md"
  for part in screen gated sgd deep; do  # the brackets, each with its records
    cp "$SWEEP/bb/$part/report/report.md" "$HERE/lr_$part.md"
    cp "$SWEEP/bb/$part/report/report.records.json.xz" "$HERE/lr_$part.records.json.xz"
  done
  cp "$SWEEP/lm_bos/report/report.md" "$HERE/lr_lm_bos.md"
  cp "$SWEEP/lm_bos/report/report.records.json.xz" "$HERE/lr_lm_bos.records.json.xz"
  for png in "$SWEEP/bb/report/"*.png; do cp "$png" "$HERE/"; done
  cp "$SWEEP/lm_bos/final_report/"*.png "$HERE/"  # names of their own (bits per byte, layer 1): lm_bos_report.md's links
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
times  # CPU time: the second line is the runs' user and system time
echo "attention_sinks: wall time $((SECONDS - START)) s"
