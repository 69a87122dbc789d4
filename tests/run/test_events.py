"""attnlab.run.events: a run's scalars read back with TensorBoard's EventAccumulator."""

import logging

from tensorboardX import SummaryWriter

from attnlab.run.events import read_scalars


def test_a_resumed_run_reads_as_its_resumed_values_without_a_restart_warning(tmp_path, caplog):
    """Interrupted after step 6, resumed from the checkpoint of step 3: the resumed writer purges from step 4
    (tensorboardX's purge_step, as board.summaries.Summaries opens it), and the reader keeps the resumed values
    without a warning of a "TensorFlow restart"."""
    first = SummaryWriter(str(tmp_path))
    for step in range(1, 7):
        first.add_scalar("train/loss", 10.0 - step, step)
    first.close()
    resumed = SummaryWriter(str(tmp_path), purge_step=4, filename_suffix=".resumed")
    for step in range(4, 9):
        resumed.add_scalar("train/loss", 100.0 - step, step)
    resumed.close()
    with caplog.at_level(logging.WARNING):
        scalars = read_scalars(tmp_path)
    assert scalars["train/loss"] == {1: 9.0, 2: 8.0, 3: 7.0, **{s: 100.0 - s for s in range(4, 9)}}
    assert not [r for r in caplog.records if "out of order" in r.getMessage()]
