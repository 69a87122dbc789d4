#!/usr/bin/env bash
# sink_formation: what decides whether attnlab's one-layer softmax head grows an attention sink on Bigram-Backcopy
# (Guo et al. 2024, arXiv 2410.13835)? sink_formation/reference sets attnlab up as Guo et al.'s model scaled to a CPU
# (it forms the sink); each other preset of the folder changes one thing towards the attention_sinks study's settings.
# Each trains seeds 0-2 (vmapped) and is reported against the reference's three seeds, with whether the sink formed
# in each (dormant-row first-key weight >= 0.3, Gu et al. 2024's ε); `attnlab-report --verdicts` joins the reports.
# Usage: bash experiments/sink_formation/run.sh [extra Hydra overrides]; SWEEP, REFRESH as ../study.sh (one scale).
set -euo pipefail
STUDY=sink_formation
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
if [ "$SCALE" != cpu ]; then
  echo "$STUDY: SCALE=$SCALE refused: the study is the reference's CPU scale, SCALE=cpu" >&2
  exit 2
fi
START=$SECONDS
DIFFERENCES="embed_std fixed_set rope mlp_bias gelu head_bias weight_decay b2 clip schedule budget"
FORMED="test/attn_dormant_first_weight/layer_0>=0.3"

# train PRESET DIR [OVERRIDES]: the preset's seeds into DIR, unless finished before
train() {
  local preset="$1" dir="$2"
  shift 2
  run_finished "$dir" && return 0
  mkdir -p "$(dirname "$dir")"
  nice -n 10 "$BIN/attnlab-train" "experiment=sink_formation/$preset" trainer.progress=none "$@" \
    "hydra.run.dir=$dir" > "$dir.log" 2>&1
}

# baseline DIR: KEY=VALUE,... of the reference's values of the keys its difference changed (their run.json)
baseline() {
  "$BIN/python" - "$SWEEP/reference/seed0/run.json" "$1/difference/seed0/run.json" <<'PY'
import json, sys
from attnlab.report.load import flatten
ref, diff = (flatten(json.load(open(path))["config"]) for path in sys.argv[1:])
print(",".join(f"{k}={'null' if ref[k] is None else ref[k]}" for k in sorted(ref) if ref[k] != diff.get(k)))
PY
}

train reference "$SWEEP/reference" "$@"
for difference in $DIFFERENCES; do
  while [ "$(jobs -pr | wc -l)" -ge 2 ]; do wait -n; done
  train "$difference" "$SWEEP/$difference/difference" "$@" &
done
for job in $(jobs -p); do wait "$job"; done  # a failed run stops the study (set -e)

# Each difference beside a copy of the reference's runs (checkpoints left out), reported against them.
for difference in $DIFFERENCES; do
  dir="$SWEEP/$difference"
  rm -rf "$dir/reference" && cp -r "$SWEEP/reference" "$dir/reference" && rm -rf "$dir/reference/checkpoints"
  nice -n 10 "$BIN/attnlab-report" "$dir" --baseline "$(baseline "$dir")" --formed "$FORMED" \
    --metrics test/attn_dormant_first_weight/layer_0 test/attn_self_weight/layer_0 test/attn_value_drain/layer_0 \
    test/trigger/accuracy test/dormant/loss --records "$dir/report.records.json.xz" > "$dir/report.log"
done
(cd "$SWEEP" && "$BIN/attnlab-report" --verdicts */report.records.json.xz) > "$SWEEP/verdicts.md"
if [ "$REFRESH" = 1 ]; then
  for difference in $DIFFERENCES; do
    cp "$SWEEP/$difference/report/report.md" "$HERE/$difference.md"
    cp "$SWEEP/$difference/report.records.json.xz" "$HERE/$difference.records.json.xz"
  done
  cp "$SWEEP/verdicts.md" "$HERE/verdicts.md"
fi
times  # CPU time: the second line is the runs' user and system time
echo "sink_formation: wall time $((SECONDS - START)) s"
