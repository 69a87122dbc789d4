# Sourced by each study's run.sh (STUDY set to its folder name, the script's arguments its extra Hydra overrides):
# the paths, the scale, and the guard that keeps a study run out of experiments/ unless asked.
#   SCALE=cpu (default): the study's presets, the scale its committed report was made at;
#   SCALE=gpu: their `_gpu` presets (configs/experiment/, the README's GPU scale).
#   SWEEP=<dir>: the sweeps and their report (default runs/<study>, runs/<study>_gpu; git-ignored).
#   STUDY_JOBS=<n> (default 1): the study's one-run steps (a screen's extensions, a confirm stage's runs) n at a time,
#   each a process of its own: one run leaves a core of two idle.
#   REFRESH=1: also copy the report over the study's committed files; refused (exit 2, one line) with extra
#   overrides or SCALE=gpu, whose report is not the committed one.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
SCALE="${SCALE:-cpu}"
REFRESH="${REFRESH:-0}"
STUDY_JOBS="${STUDY_JOBS:-1}"
case "$SCALE" in
  cpu) SUFFIX="" ;;
  gpu) SUFFIX="_gpu" ;;
  *) echo "$STUDY: SCALE=$SCALE unknown; allowed: cpu, gpu" >&2; exit 2 ;;
esac
SWEEP="${SWEEP:-$ROOT/runs/${SWEEP_NAME:-$STUDY}$SUFFIX}"
if [ "${COPY:-0}" != 0 ]; then  # COPY=0, the old way to leave the study folder untouched, is the default now
  echo "$STUDY: COPY=$COPY is gone; the report stays in \$SWEEP/report, REFRESH=1 copies it into experiments/$STUDY" >&2
  exit 2
fi
if ! [[ "$STUDY_JOBS" =~ ^[1-9][0-9]*$ ]]; then
  echo "$STUDY: STUDY_JOBS=$STUDY_JOBS unknown; allowed: a whole number from 1" >&2
  exit 2
fi
if [ "$REFRESH" != 0 ] && [ "$REFRESH" != 1 ]; then
  echo "$STUDY: REFRESH=$REFRESH unknown; allowed: 0, 1" >&2
  exit 2
fi
if [ "$REFRESH" = 1 ] && { [ $# -gt 0 ] || [ "$SCALE" != cpu ]; }; then
  echo "$STUDY: REFRESH=1 refused: the committed report is the study's own settings (SCALE=cpu, no overrides);" \
    "got SCALE=$SCALE${*:+ and $*}" >&2
  exit 2
fi

# run_finished DIR: whether the run in DIR finished: its metrics.json, or a vmapped run's in DIR/seed<k>/.
run_finished() {
  [ -e "$1/metrics.json" ] || compgen -G "$1/seed*/metrics.json" > /dev/null
}

# finished_or_run DIR COMMAND...: COMMAND (a sweep into DIR), then its arguments into DIR/.finished. A DIR finished by
# the same COMMAND is kept and nothing runs, so a study stopped part-way resumes at its first unfinished sweep (the one
# it stopped in runs again whole); one finished by another command is refused (exit 2), never mixed into a report.
finished_or_run() {
  local dir="$1"
  shift
  if [ -e "$dir/.finished" ]; then
    if [ "$(cat "$dir/.finished")" != "$(printf '%s\n' "$@")" ]; then
      echo "$STUDY: $dir was finished by another command ($dir/.finished); remove it or choose another SWEEP" >&2
      return 2
    fi
    echo "$STUDY: $dir finished earlier, kept" >&2
    return 0
  fi
  nice -n 10 "$@"
  printf '%s\n' "$@" > "$dir/.finished"
}

# side_by_side COMMAND...: COMMAND in the background, waiting for the ones before it whenever STUDY_JOBS run;
# side_by_side_wait waits for the rest. A failed command stops the study (set -e) where it is waited for.
SIDE_BY_SIDE=()
side_by_side() {
  "$@" &
  SIDE_BY_SIDE+=("$!")
  [ ${#SIDE_BY_SIDE[@]} -lt "$STUDY_JOBS" ] || side_by_side_wait
}
side_by_side_wait() {
  local pid
  for pid in ${SIDE_BY_SIDE[@]+"${SIDE_BY_SIDE[@]}"}; do wait "$pid"; done
  SIDE_BY_SIDE=()
}

# bracket_screen SWEEP_DIR GROUP_KEY[,GROUP_KEY...] LIMIT [REPORT_ARGS...] -- TRAIN_ARGS...
#   A learning-rate screen that extends its grid until every cell's selected rate is interior (bracketed):
#   1. "$BIN/attnlab-train" -m TRAIN_ARGS hydra.sweep.dir=SWEEP_DIR/grid: the screen (TRAIN_ARGS sweep optim.lr,
#      e.g. experiment=lm_normalizers/screen, or normalizer=softmax,relu optim.lr=1e-3,3e-3,1e-2 ...);
#   2. "$BIN/attnlab-report" SWEEP_DIR --group-by GROUP_KEY... --select-lr --select-by val/loss --curves REPORT_ARGS
#      (SWEEP_DIR/report, its records in SWEEP_DIR/report/report.records.json.xz; REPORT_ARGS come last, so
#      --select-by or --curves there replaces these);
#   3. each cell at an edge of its grid (report.csv's lr_at_edge) gets one more rate beyond it, the grid's own ratio
#      (experiments/bracket_lrs.py): attnlab-train -m TRAIN_ARGS KEY=VALUE... optim.lr=RATE
#      hydra.sweep.dir=SWEEP_DIR/extend<round>/<n> (TRAIN_ARGS' own GROUP_KEY= and optim.lr= left out); then 2 again;
#   at most LIMIT rounds of 3 (0: none), a round's extensions STUDY_JOBS at a time. A sweep that finished before is not run again (finished_or_run), a round
#   resumed extends the cells it chose (SWEEP_DIR/extend<round>/cells.txt). Then it says which cells never bracketed (stderr, one line each), or that
#   every one did, and returns 0 either way: SWEEP_DIR/report/report.csv holds the selection (read it with
#   experiments/selected_lrs.py), the last report's terminal output is SWEEP_DIR/report.log, and the report's verdict
#   names the cells left at an edge. A failed train or report stops the study (set -e). Example, in a run.sh:
#     bracket_screen "$SWEEP/screen" normalizer 3 --metrics val/loss val/bits_per_byte -- \
#       "experiment=lm_normalizers/screen$SUFFIX" "$@"
bracket_screen() {
  if [ $# -lt 4 ] || ! [[ "$3" =~ ^[0-9]+$ ]]; then
    echo "bracket_screen: usage: bracket_screen SWEEP_DIR GROUP_KEY[,GROUP_KEY...] LIMIT [REPORT_ARGS...]" \
      "-- TRAIN_ARGS...; got: $*" >&2
    return 2
  fi
  local dir="$1" keys="$2" limit="$3" round n line
  shift 3
  local report_args=() train_args=() extend_args=() group=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do report_args+=("$1"); shift; done
  if [ $# -eq 0 ]; then
    echo "bracket_screen: no -- before the attnlab-train arguments" >&2
    return 2
  fi
  shift
  train_args=("$@")
  IFS=, read -r -a group <<< "$keys"
  local arg key own
  for arg in "${train_args[@]}"; do  # an extension names its cell and rate: the screen's own values of them go
    own=0
    for key in "${group[@]}" optim.lr; do
      case "$arg" in "$key="*) own=1 ;; esac
    done
    [ "$own" = 1 ] || extend_args+=("$arg")
  done
  local report=("$BIN/attnlab-report" "$dir" --group-by "${group[@]}" --select-lr --select-by val/loss --curves
    --records "$dir/report/report.records.json.xz" ${report_args[@]+"${report_args[@]}"})
  finished_or_run "$dir/grid" "$BIN/attnlab-train" -m "${train_args[@]}" "hydra.sweep.dir=$dir/grid"
  nice -n 10 "${report[@]}" > "$dir/report.log"  # each round's report.md replaces the last; the log keeps the last
  for ((round = 1; round <= limit; round++)); do
    local next=() plan="$dir/extend$round/cells.txt"
    if [ -e "$plan" ]; then  # a resumed round extends the cells it chose when it began
      mapfile -t next < "$plan"
    else
      mapfile -t next < <("$BIN/python" "$ROOT/experiments/bracket_lrs.py" "$dir/report/report.csv" "$keys")
      [ ${#next[@]} -gt 0 ] || break
      mkdir -p "$dir/extend$round"
      printf '%s\n' "${next[@]}" > "$plan"
    fi
    n=0
    for line in "${next[@]}"; do
      local cell=()
      read -r -a cell <<< "$line"
      echo "bracket_screen: round $round of $limit: ${cell[*]}" >&2
      side_by_side finished_or_run "$dir/extend$round/$n" "$BIN/attnlab-train" -m \
        ${extend_args[@]+"${extend_args[@]}"} "${cell[@]}" "hydra.sweep.dir=$dir/extend$round/$n"
      n=$((n + 1))
    done
    side_by_side_wait
    nice -n 10 "${report[@]}" > "$dir/report.log"
  done
  local edges=()
  mapfile -t edges < <("$BIN/python" "$ROOT/experiments/bracket_lrs.py" "$dir/report/report.csv" "$keys" --edges)
  if [ ${#edges[@]} -eq 0 ]; then
    echo "bracket_screen: every cell's selected rate is interior to its grid ($dir/report/report.csv)" >&2
  else
    for line in "${edges[@]}"; do
      echo "bracket_screen: never bracketed after $limit extension(s): $line" >&2
    done
  fi
}

# lr_flag KEY CSV...: --select-lr where the rates the screens selected (their report.csv) differ; attnlab-report
# refuses it over runs of a single rate, as a final report over those selections may be.
lr_flag() {
  local key="$1" csv rates=()
  shift
  for csv in "$@"; do
    mapfile -t -O "${#rates[@]}" rates < <("$BIN/python" "$ROOT/experiments/selected_lrs.py" "$csv" "$key" | cut -d' ' -f2)
  done
  [ "$(printf '%s\n' "${rates[@]}" | sort -u | wc -l)" -gt 1 ] && echo --select-lr || true
}
