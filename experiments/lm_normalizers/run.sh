#!/usr/bin/env bash
# lm_normalizers: every attention normalizer on byte-level language modelling (task=lm) at its own learning rate,
# in two stages (as normalizer_ablation):
#  1. screen: 8 normalizers x 3 rates spanning 10x (1e-3, 3e-3, 1e-2), seed 0; the rate is selected per normalizer
#     on validation loss, and a grid whose selected rate is at an edge extended one rate beyond it, at most twice
#     (study.sh's bracket_screen);
#  2. confirm: seeds 1 and 2 (vmapped) at each normalizer's selected rate, so the reported cell has 3 seeds.
# Test bits per byte at equal steps, beside the unigram and bigram baselines (baselines.py), with attention-entropy
# and gradient-norm curves.
# The stages are the presets configs/experiment/lm_normalizers/screen.yaml and confirm.yaml
# (`attnlab-train -m experiment=lm_normalizers/screen`); this script runs both, selects the rates between them and
# writes the reports into $SWEEP/report*.
# Usage: bash experiments/lm_normalizers/run.sh [extra Hydra overrides, appended to every run; normalizer= and
#   optim.lr= reach the screen only, the confirm stage takes the screen's selection]
# SCALE=gpu (the screen_gpu and confirm_gpu presets), SWEEP=<dir> (default runs/lm_normalizers), REFRESH=1 (copy the
# reports into this folder): ../study.sh.
set -euo pipefail
STUDY=lm_normalizers
SWEEP_NAME=lm_normalizers
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
START=$SECONDS
CONFIRM_EXTRA=()  # the extra overrides but the screen's own keys, whose values the screen selects
for override in "$@"; do
  case "$override" in normalizer=* | optim.lr=*) ;; *) CONFIRM_EXTRA+=("$override") ;; esac
done

bracket_screen "$SWEEP/screen" normalizer 2 --metrics val/loss val/bits_per_byte -- \
  "experiment=lm_normalizers/screen$SUFFIX" "$@"
while read -r norm lr; do
  run_finished "$SWEEP/confirm/${norm#normalizer=}" && continue  # finished before: a resumed study keeps it
  nice -n 10 "$BIN/attnlab-train" "experiment=lm_normalizers/confirm$SUFFIX" "$norm" "$lr" \
    "hydra.run.dir=$SWEEP/confirm/${norm#normalizer=}" ${CONFIRM_EXTRA[@]+"${CONFIRM_EXTRA[@]}"}
done < <("$BIN/python" "$ROOT/experiments/selected_lrs.py" "$SWEEP/screen/report/report.csv" normalizer)

# The final report reads each normalizer's runs at its selected rate alone (selected_runs.py): re-selecting over every
# rate would weigh the screen's one seed against the selected rate's three.
for part in screen confirm; do
  "$BIN/python" "$ROOT/experiments/selected_runs.py" "$SWEEP/screen/report/report.csv" normalizer "$SWEEP/$part" \
    "$SWEEP/final"
done
nice -n 10 "$BIN/attnlab-report" "$SWEEP/final" --out "$SWEEP/report" --group-by normalizer \
  $(lr_flag normalizer "$SWEEP/screen/report/report.csv") --select-by val/loss \
  --metrics test/bits_per_byte test/accuracy \
  --baseline normalizer=softmax \
  --curves val/bits_per_byte train/loss attn_entropy/layer_0/head_0 attn_entropy/layer_1/head_0 grad_norm/global \
  --log-y 'grad_norm/*'
nice -n 10 "$BIN/attnlab-report" "$SWEEP/screen" --group-by normalizer optim.lr \
  --metrics test/bits_per_byte val/bits_per_byte val/loss \
  --curves val/bits_per_byte --out "$SWEEP/report_all_lrs"
nice -n 10 "$BIN/python" "$HERE/baselines.py" "$SWEEP" > "$SWEEP/report/baselines.md"

if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/baselines.md" "$HERE/"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  cp "$SWEEP/report_all_lrs/report.md" "$HERE/all_lrs.md"
  cp "$SWEEP/report_all_lrs/curve_val_bits_per_byte.png" "$HERE/all_lrs_curve_val_bits_per_byte.png"
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
times  # CPU time: the second line is the runs' user and system time
echo "lm_normalizers: wall time $((SECONDS - START)) s"
