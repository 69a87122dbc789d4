# Sourced by each study's run.sh (STUDY set to its folder name, the script's arguments its extra Hydra overrides):
# the paths, the scale, and the guard that keeps a study run out of experiments/ unless asked.
#   SCALE=cpu (default): the study's presets, the scale its committed report was made at;
#   SCALE=gpu: their `_gpu` presets (configs/experiment/, the README's GPU scale).
#   SWEEP=<dir>: the sweeps and their report (default runs/<study>, runs/<study>_gpu; git-ignored).
#   REFRESH=1: also copy the report over the study's committed files; refused (exit 2, one line) with extra
#   overrides or SCALE=gpu, whose report is not the committed one.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
SCALE="${SCALE:-cpu}"
REFRESH="${REFRESH:-0}"
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
if [ "$REFRESH" != 0 ] && [ "$REFRESH" != 1 ]; then
  echo "$STUDY: REFRESH=$REFRESH unknown; allowed: 0, 1" >&2
  exit 2
fi
if [ "$REFRESH" = 1 ] && { [ $# -gt 0 ] || [ "$SCALE" != cpu ]; }; then
  echo "$STUDY: REFRESH=1 refused: the committed report is the study's own settings (SCALE=cpu, no overrides);" \
    "got SCALE=$SCALE${*:+ and $*}" >&2
  exit 2
fi
