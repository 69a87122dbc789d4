#!/usr/bin/env bash
# normalizer_ablation, past the transition: the normalizers that sat on the MQAR plateau at 800 steps, run for 2000
# steps at the rate where the history's 1-seed supplement saw them leave it (ReLU 3e-3, sigmoid 1e-3), 3 vmapped seeds:
# the presets configs/experiment/normalizer_ablation/long_relu.yaml and long_sigmoid.yaml, one run each
# (`attnlab-train experiment=normalizer_ablation/long_relu`), and their report into $SWEEP/report.
# 1.5-entmax (3e-3) is left out for cost (~3x a ReLU step); run it beside them with:
#   attnlab-train experiment=normalizer_ablation/long_relu normalizer=entmax hydra.run.dir=runs/normalizer_ablation_long/entmax
# Usage: bash experiments/normalizer_ablation/long.sh [extra Hydra overrides]
# SWEEP=<dir> (default runs/normalizer_ablation_long), REFRESH=1 (copy the report into this folder as long.md): ../study.sh.
set -euo pipefail
STUDY=normalizer_ablation
SWEEP_NAME=normalizer_ablation_long
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
if [ "$SCALE" != cpu ]; then
  echo "normalizer_ablation long.sh: SCALE=$SCALE unknown here; only cpu (no GPU scale was named for it)" >&2
  exit 2
fi
START=$SECONDS
# the two runs side by side, one per core, each unless finished before; a failed run stops the script (set -e)
mkdir -p "$SWEEP"
run_finished "$SWEEP/relu" || nice -n 10 "$BIN/attnlab-train" experiment=normalizer_ablation/long_relu \
  trainer.progress=none "hydra.run.dir=$SWEEP/relu" "$@" > "$SWEEP/relu.log" 2>&1 &
run_finished "$SWEEP/sigmoid" || nice -n 10 "$BIN/attnlab-train" experiment=normalizer_ablation/long_sigmoid \
  trainer.progress=none "hydra.run.dir=$SWEEP/sigmoid" "$@" > "$SWEEP/sigmoid.log" 2>&1 &
for job in $(jobs -p); do wait "$job"; done
# formed: MQAR solved (test accuracy >= 0.99), per seed: the phenomenon the study's claims are about
nice -n 10 "$BIN/attnlab-report" "$SWEEP" --group-by normalizer optim.lr --formed 'test/accuracy>=0.99' \
  --metrics test/accuracy test/loss --curves val/accuracy --records "$SWEEP/long.records.json.xz" > "$SWEEP/report.log"
if [ "$REFRESH" = 1 ]; then
  cp "$SWEEP/report/report.md" "$HERE/long.md"
  cp "$SWEEP/long.records.json.xz" "$HERE/long.records.json.xz"
  cp "$SWEEP/report/curve_val_accuracy.png" "$HERE/long_curve_val_accuracy.png"
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE/long_curve_val_accuracy.png"
fi
times  # CPU time: the second line is the runs' user and system time
echo "normalizer_ablation long: wall time $((SECONDS - START)) s"
