#!/usr/bin/env bash
# lm_normalizers: every attention normalizer of the mission and of the attention-sink papers on language modelling as
# those papers measure it (task=lm on CPython's standard library source, task.corpus=python_stdlib, seen less than once
# per run; a 2,048-id byte-level BPE, documents packed each opened by a BOS; a LLaMA-style block at model=small's
# size), each at its own learning rate, in two stages (as normalizer_ablation):
#  1. screen: 10 normalizers x 3 rates spanning 10x (3e-3, 1e-2, 3e-2), seed 0; the rate is selected per normalizer
#     on validation loss, and a grid whose selected rate is at an edge extended one rate beyond it, at most twice
#     (study.sh's bracket_screen);
#  2. confirm: seeds 1 and 2 (vmapped) at each normalizer's selected rate, so the reported cell has 3 seeds.
# Test bits per byte at equal steps, beside the unigram and bigram baselines (baselines.py); the phenomenon the
# comparison needs is a model that learned language beyond a byte bigram (--formed: softmax's test bits per byte
# below the training text's byte bigram conditional entropy, 3.4935 — the lm task's bits_per_byte_bigram baseline at
# tokenizer=bytes on the same split —, in every seed). Attention-entropy and gradient-norm curves.
# The stages are the presets configs/experiment/lm_normalizers/screen.yaml and confirm.yaml
# (`attnlab-train -m experiment=lm_normalizers/screen`); this script runs both, selects the rates between them and
# writes the reports into $SWEEP/report*, the final one's records beside it (report.records.json.xz).
# Usage: bash experiments/lm_normalizers/run.sh [extra Hydra overrides, appended to every run; normalizer= and
#   optim.lr= reach the screen only, the confirm stage takes the screen's selection]
# SCALE=gpu (the screen_gpu and confirm_gpu presets), SWEEP=<dir> (default runs/lm_normalizers), REFRESH=1 (copy the
# reports into this folder), STUDY_JOBS=2 (the extensions and the confirm runs two at a time): ../study.sh.
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
  side_by_side nice -n 10 "$BIN/attnlab-train" "experiment=lm_normalizers/confirm$SUFFIX" "$norm" "$lr" \
    "hydra.run.dir=$SWEEP/confirm/${norm#normalizer=}" ${CONFIRM_EXTRA[@]+"${CONFIRM_EXTRA[@]}"} < /dev/null
done < <("$BIN/python" "$ROOT/experiments/selected_lrs.py" "$SWEEP/screen/report/report.csv" normalizer)
side_by_side_wait

# The final report reads each normalizer's runs at its selected rate alone (selected_runs.py): re-selecting over every
# rate would weigh the screen's one seed against the selected rate's three.
for part in screen confirm; do
  "$BIN/python" "$ROOT/experiments/selected_runs.py" "$SWEEP/screen/report/report.csv" normalizer "$SWEEP/$part" \
    "$SWEEP/final"
done
nice -n 10 "$BIN/attnlab-report" "$SWEEP/final" --out "$SWEEP/report" --group-by normalizer \
  $(lr_flag normalizer "$SWEEP/screen/report/report.csv") --select-by val/loss \
  --metrics test/bits_per_byte test/accuracy test/attn_first_weight/layer_0 test/attn_first_weight/layer_1 \
  --baseline normalizer=softmax --formed 'test/bits_per_byte<3.4935' --records "$SWEEP/report/report.records.json.xz" \
  --curves val/bits_per_byte train/loss attn_entropy/layer_0/head_0 attn_entropy/layer_1/head_0 grad_norm/global \
  --log-y 'grad_norm/*'
nice -n 10 "$BIN/attnlab-report" "$SWEEP/screen" --group-by normalizer optim.lr \
  --metrics test/bits_per_byte val/bits_per_byte val/loss \
  --curves val/bits_per_byte --out "$SWEEP/report_all_lrs" --records "$SWEEP/report_all_lrs/report.records.json.xz"
nice -n 10 "$BIN/python" "$HERE/baselines.py" "$SWEEP" > "$SWEEP/report/baselines.md"

if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/report.records.json.xz" "$SWEEP/report/baselines.md" "$HERE/"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  cp "$SWEEP/report_all_lrs/report.md" "$HERE/all_lrs.md"
  cp "$SWEEP/report_all_lrs/report.records.json.xz" "$HERE/all_lrs.records.json.xz"
  cp "$SWEEP/report_all_lrs/curve_val_bits_per_byte.png" "$HERE/all_lrs_curve_val_bits_per_byte.png"
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
times  # CPU time: the second line is the runs' user and system time
echo "lm_normalizers: wall time $((SECONDS - START)) s"
