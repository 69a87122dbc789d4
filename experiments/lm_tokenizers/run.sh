#!/usr/bin/env bash
# lm_tokenizers: byte-level against BPE language modelling (task.tokenizer=bytes,bpe) at each one's own learning rate,
# in two stages (as lm_normalizers):
#  1. screen: 2 tokenizers x 3 rates spanning 10x (1e-3, 3e-3, 1e-2), seed 0; the rate is selected per tokenizer
#     on validation loss, and a grid whose selected rate is at an edge extended one rate beyond it, at most twice
#     (study.sh's bracket_screen);
#  2. confirm: seeds 1 and 2 (vmapped) at each tokenizer's selected rate, so the reported cell has 3 seeds;
#  then both again for the context control, bytes in windows of 256 (screen_context, confirm_context): as much text in
#  its context and as many bytes a step as the BPE's 64 tokens hold.
# Test bits per byte (each split's bytes counted once, so comparable across tokenizers) at equal steps, bytes as the
# baseline cell. The phenomenon the comparison needs is a model that learned language beyond a byte bigram (--formed:
# test bits per byte below the default corpus's training-text byte bigram rate, 3.5301 — the lm task's
# baseline/bits_per_byte_bigram at tokenizer=bytes —, in every seed).
# The stages are the presets configs/experiment/lm_tokenizers/screen.yaml and confirm.yaml
# (`attnlab-train -m experiment=lm_tokenizers/screen`); this script runs both, selects the rates between them and
# writes the reports into $SWEEP/report*, each with its records beside it.
# Usage: bash experiments/lm_tokenizers/run.sh [extra Hydra overrides, appended to every run; task.tokenizer= and
#   optim.lr= reach the screen only, the confirm stage takes the screen's selection]
# SCALE=gpu (the screen_gpu and confirm_gpu presets), SWEEP=<dir> (default runs/lm_tokenizers), REFRESH=1 (copy the
# reports into this folder): ../study.sh.
set -euo pipefail
STUDY=lm_tokenizers
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
START=$SECONDS
CONFIRM_EXTRA=()  # the extra overrides but the screen's own keys, whose values the screen selects
for override in "$@"; do
  case "$override" in task.tokenizer=* | optim.lr=*) ;; *) CONFIRM_EXTRA+=("$override") ;; esac
done

# confirm PRESET SCREEN: seeds 1 and 2 (vmapped) at each cell's selected rate ($SWEEP/SCREEN/report/report.csv) into
# $SWEEP/<PRESET's stage>/<tokenizer>; then the selected rate's runs of the screen and of these into $SWEEP/final/SCREEN
# (the final report reads them alone: selected_runs.py).
confirm() {
  local preset="$1" screen="$2" stage tokenizer lr part
  stage="$(basename "${preset%"$SUFFIX"}")"
  while read -r tokenizer lr; do
    run_finished "$SWEEP/$stage/${tokenizer#task.tokenizer=}" && continue  # finished before: kept on resume
    nice -n 10 "$BIN/attnlab-train" "experiment=$preset" "$tokenizer" "$lr" \
      "hydra.run.dir=$SWEEP/$stage/${tokenizer#task.tokenizer=}" ${CONFIRM_EXTRA[@]+"${CONFIRM_EXTRA[@]}"}
  done < <("$BIN/python" "$ROOT/experiments/selected_lrs.py" "$SWEEP/$screen/report/report.csv" task.tokenizer)
  for part in "$screen" "$stage"; do
    "$BIN/python" "$ROOT/experiments/selected_runs.py" "$SWEEP/$screen/report/report.csv" task.tokenizer \
      "$SWEEP/$part" "$SWEEP/final/$screen"
  done
}

# Selected on validation bits per byte, the report's headline, comparable across tokenizers (a loss per token is not).
bracket_screen "$SWEEP/screen" task.tokenizer 2 --select-by val/bits_per_byte --metrics val/bits_per_byte -- \
  "experiment=lm_tokenizers/screen$SUFFIX" "$@"
confirm "lm_tokenizers/confirm$SUFFIX" screen
bracket_screen "$SWEEP/screen_context" task.tokenizer 2 --select-by val/bits_per_byte --metrics val/bits_per_byte -- \
  "experiment=lm_tokenizers/screen_context$SUFFIX" "$@"
confirm "lm_tokenizers/confirm_context$SUFFIX" screen_context

nice -n 10 "$BIN/attnlab-report" "$SWEEP/final" --out "$SWEEP/report" --group-by task.tokenizer task.seq_len \
  $(lr_flag task.tokenizer "$SWEEP/screen/report/report.csv" "$SWEEP/screen_context/report/report.csv") \
  --select-by val/bits_per_byte --metrics test/bits_per_byte \
  --baseline task.tokenizer=bytes,task.seq_len=64 --formed 'test/bits_per_byte<3.5301' \
  --records "$SWEEP/report/report.records.json.xz" \
  --curves val/bits_per_byte attn_entropy/layer_0/head_0 attn_entropy/layer_1/head_0 grad_norm/global \
  --log-y 'grad_norm/*'
for screen in screen screen_context; do
  nice -n 10 "$BIN/attnlab-report" "$SWEEP/$screen" --group-by task.tokenizer optim.lr \
    --metrics test/bits_per_byte val/bits_per_byte --curves val/bits_per_byte --out "$SWEEP/report_all_lrs_$screen" \
    --records "$SWEEP/report_all_lrs_$screen/report.records.json.xz"
done

if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$SWEEP/report/report.records.json.xz" "$HERE/"
  cp "$SWEEP/report/"*.png "$HERE/" 2>/dev/null || true
  cp "$SWEEP/report_all_lrs_screen/report.md" "$HERE/all_lrs.md"
  cp "$SWEEP/report_all_lrs_screen/report.records.json.xz" "$HERE/all_lrs.records.json.xz"
  cp "$SWEEP/report_all_lrs_screen_context/report.md" "$HERE/all_lrs_context.md"
  cp "$SWEEP/report_all_lrs_screen_context/report.records.json.xz" "$HERE/all_lrs_context.records.json.xz"
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*.png  # 256-colour palette, ~3x smaller
fi
times  # CPU time: the second line is the runs' user and system time
echo "lm_tokenizers: wall time $((SECONDS - START)) s"
