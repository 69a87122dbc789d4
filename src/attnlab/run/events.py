"""A run's TensorBoard scalars read back with TensorBoard's own EventAccumulator (the report's curves, a finished
run's val curve for its record)."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)  # unconfigured: Python's last-resort handler writes warnings to stderr


class _PluginlessDescription(logging.Filter):
    """Drops EventAccumulator's "summary with tag ... oddly not associated with a plugin" warning, one per tag and
    run of an event file whose descriptions name no plugin, as tensorboardX's add_scalar(summary_description=...)
    writes them (board.summaries.Summaries names the scalars plugin). Every other warning of the reader passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "oddly not associated with a plugin" not in str(record.msg)


def read_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of a run, read with TensorBoard's own EventAccumulator (every scalar kept)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tb_logging

    if not any(Path(run_dir).glob("events.out.tfevents.*")):
        log.warning("attnlab-report: warning: %s has no TensorBoard event file; its curves are left out", run_dir)
        return {}
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "histograms": 1, "images": 1, "tensors": 1})
    quiet, logger = _PluginlessDescription(), tb_logging.get_logger()
    level = logger.level
    logger.addFilter(quiet)
    logger.setLevel(max(level, logging.WARNING))  # its INFO lines ("No path found after ...") would fill a job's log
    try:
        acc.Reload()
    finally:
        logger.removeFilter(quiet)
        logger.setLevel(level)
    # A step written twice (a resumed run) keeps its last value.
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags().get("scalars", [])}
