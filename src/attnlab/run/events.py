"""A run's TensorBoard scalars read back with TensorBoard's own EventAccumulator (the report's curves, a finished
run's val curve for its record)."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)  # unconfigured: Python's last-resort handler writes warnings to stderr


class _ExpectedWarnings(logging.Filter):
    """Drops two warnings of EventAccumulator that attnlab's own runs cause by design; every other one passes:
    - "summary with tag ... oddly not associated with a plugin", one per tag and run of an event file whose
      descriptions name no plugin, as tensorboardX's add_scalar(summary_description=...) writes them
      (board.summaries.Summaries names the scalars plugin);
    - "Detected out of order event.step likely caused by a TensorFlow restart. Purging ...", for a resumed run: it
      logs again from its checkpoint's step, and the reader drops the interrupted run's later values, as it should.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return "oddly not associated with a plugin" not in message and "Detected out of order event" not in message


def read_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of a run, read with TensorBoard's own EventAccumulator (every scalar kept)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tb_logging

    if not any(Path(run_dir).glob("events.out.tfevents.*")):
        log.warning("attnlab-report: warning: %s has no TensorBoard event file; its curves are left out", run_dir)
        return {}
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "histograms": 1, "images": 1, "tensors": 1})
    quiet, logger = _ExpectedWarnings(), tb_logging.get_logger()
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
