#!/usr/bin/env bash
# sink_formation: what decides whether attnlab's one-layer softmax head grows an attention sink on Bigram-Backcopy
# (Guo et al. 2024, arXiv 2410.13835)? From sink_formation/reference, attnlab set up as Guo et al.'s model scaled to a
# CPU (where it forms the sink), one difference at a time towards the attention_sinks study's settings: each
# difference trains seeds 0-2 (vmapped) and is reported against the reference's own three seeds, whether the sink
# formed (dormant-row first-key weight >= 0.3, Gu et al. 2024's ε) in each seed; `--verdicts` joins the reports.
# Usage: bash experiments/sink_formation/run.sh [extra Hydra overrides]; SWEEP, REFRESH as ../study.sh.
set -euo pipefail
STUDY=sink_formation
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../study.sh"
PRESET="experiment=sink_formation/reference$SUFFIX"
FORMED="test/attn_dormant_first_weight/layer_0>=0.3"
# name: the overrides that turn the reference's value into the study's (attention_sinks/_study_.yaml, adamw.yaml)
DIFFERENCES=(
  "embed_std:model.embed_std=null"
  "fixed_set:task.fresh=false"
  "rope:model.positional=rope"
  "mlp_bias:model.bias=null"
  "gelu:model.mlp=gelu"
  "head_bias:head.bias=true"
  "weight_decay:optim.weight_decay=0.1"
  "b2:optim.b2=0.98"
  "clip:optim.clip_norm=1.0"
  "schedule:optim.warmup_steps=100 optim.final_fraction=0.1"
  "budget:trainer.batch_size=32 trainer.steps=800"
)

# train DIR OVERRIDES...: seeds 0-2 of the preset with OVERRIDES into DIR, unless finished before
train() {
  local dir="$1"
  shift
  run_finished "$dir" && return 0
  mkdir -p "$(dirname "$dir")"
  nice -n 10 "$BIN/attnlab-train" "$PRESET" seed=0 trainer.vmap_seeds=3 trainer.progress=none "$@" \
    "hydra.run.dir=$dir" > "$dir.log" 2>&1
}

mkdir -p "$SWEEP"
train "$SWEEP/reference" "$@"
for entry in "${DIFFERENCES[@]}"; do
  while [ "$(jobs -pr | wc -l)" -ge 2 ]; do wait -n; done
  read -r -a overrides <<< "${entry#*:}"
  train "$SWEEP/${entry%%:*}/difference" "${overrides[@]}" "$@" &
done
for job in $(jobs -p); do wait "$job"; done  # a failed run stops the study (set -e)

# Each difference beside a copy of the reference's runs (checkpoints left out), reported against it.
records=()
for entry in "${DIFFERENCES[@]}"; do
  name="${entry%%:*}" baseline=()
  read -r -a overrides <<< "${entry#*:}"
  rm -rf "$SWEEP/$name/reference" && cp -r "$SWEEP/reference" "$SWEEP/$name/reference"
  rm -rf "$SWEEP/$name/reference/checkpoints"
  for override in "${overrides[@]}"; do
    key="${override%%=*}"
    baseline+=("$key=$("$BIN/python" -c 'import json, sys; c = json.load(open(sys.argv[1]))["config"]
for part in sys.argv[2].split("."): c = c[part]
print("null" if c is None else c)' "$SWEEP/reference/seed0/run.json" "$key")")
  done
  nice -n 10 "$BIN/attnlab-report" "$SWEEP/$name" --baseline "$(IFS=,; echo "${baseline[*]}")" --formed "$FORMED" \
    --metrics test/attn_dormant_first_weight/layer_0 test/trigger/accuracy test/dormant/loss \
    --records "$SWEEP/$name/report.records.json.xz" > "$SWEEP/$name.report.log"
  records+=("$SWEEP/$name/report.records.json.xz")
done
"$BIN/attnlab-report" --verdicts "${records[@]}" | tee "$SWEEP/verdicts.md"
if [ "$REFRESH" = 1 ]; then
  for entry in "${DIFFERENCES[@]}"; do
    name="${entry%%:*}"
    cp "$SWEEP/$name/report/report.md" "$HERE/$name.md"
    cp "$SWEEP/$name/report.records.json.xz" "$HERE/$name.records.json.xz"
  done
  cp "$SWEEP/verdicts.md" "$HERE/verdicts.md"
fi
echo "$STUDY: done in $((SECONDS / 60)) min; reports in $SWEEP/*/report"
