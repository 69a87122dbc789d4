#!/usr/bin/env bash
# final_softmax: does the output head need a final softmax? (seed 000) Two sweeps, two presets:
#   final_softmax/classification: digits, head=softmax_ce (final softmax + CE) vs head=scores_mse (raw scores +
#     square loss), accuracy, NLL and ECE before/after temperature scaling;
#   final_softmax/regression: in-context linear regression, head=mse (no final softmax) vs head=hlgauss (softmax
#     over bins).
# Each is `attnlab-train -m experiment=final_softmax/<part>`; this script runs both and their reports, into
# $SWEEP/<part>/report, each report's records beside it (report.records.json.xz).
# Usage: bash experiments/final_softmax/run.sh [extra Hydra overrides, appended to both sweeps]
# SCALE=gpu (the <part>_gpu presets), SWEEP=<dir>, REFRESH=1 (copy the reports into this folder): ../study.sh.
set -euo pipefail
STUDY=final_softmax
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
START=$SECONDS

nice -n 10 "$BIN/attnlab-train" -m "experiment=final_softmax/classification$SUFFIX" \
  "hydra.sweep.dir=$SWEEP/classification" "$@"
nice -n 10 "$BIN/attnlab-report" "$SWEEP/classification" --group-by head \
  --metrics test/accuracy test/nll test/nll_ts test/ece test/ece_ts test/temperature test/brier \
  --baseline head=softmax_ce --curves val/accuracy val/loss val/ece \
  --records "$SWEEP/classification/report/report.records.json.xz"

nice -n 10 "$BIN/attnlab-train" -m "experiment=final_softmax/regression$SUFFIX" \
  "hydra.sweep.dir=$SWEEP/regression" "$@"
nice -n 10 "$BIN/attnlab-report" "$SWEEP/regression" --group-by head \
  --metrics test/mse test/mse_rel test/r2 \
  --baseline head=mse --curves val/mse val/r2 --records "$SWEEP/regression/report/report.records.json.xz"

if [ "$REFRESH" = 1 ]; then
  for part in classification regression; do
    mkdir -p "$HERE/$part"
    cp "$SWEEP/$part/report/report.md" "$SWEEP/$part/report/report.records.json.xz" "$HERE/$part/"
    cp "$SWEEP/$part/report/"*.png "$HERE/$part/" 2>/dev/null || true
  done
  nice -n 10 "$BIN/python" "$ROOT/experiments/shrink_png.py" "$HERE"/*/*.png  # 256-colour palette, ~3x smaller
fi
echo "final_softmax: wall time $((SECONDS - START)) s"
