"""attnlab.progress: a sweep job's labelled output (its lines side by side under joblib: sweep/test_watch.py)."""

import contextlib
import io
import sys

from absl import logging as absl_logging

from attnlab.progress import labelled


def test_a_job_labels_its_lines_and_its_unfinished_last_one():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), labelled("3_normalizer=kl"):
        print("step 2: loss 1.0\nstep 4", end="", file=sys.stderr)
    assert err.getvalue() == "[3_normalizer=kl] step 2: loss 1.0\n[3_normalizer=kl] step 4\n"


def test_a_handler_made_inside_a_job_never_closes_the_process_stream():
    """A joblib worker runs job after job. absl's logging handler, made while a job's stderr was labelled, is
    closed by the next job's logging set-up; the process's stderr must stay open for that job's lines."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        with labelled("0_normalizer=softmax"):
            handler = absl_logging.PythonHandler()  # its stream: the labelled sys.stderr of this moment
        handler.close()
        assert not err.closed
        print("job 1 still prints", file=sys.stderr)
    assert err.getvalue().endswith("job 1 still prints\n")
