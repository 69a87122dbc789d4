"""The exit codes of attnlab-train, one per outcome, for a single run and a sweep alike (README: Exit codes);
attnlab-report exits with REFUSED on bad input, and `attnlab-report RECORDS --verify` with FAILED when the report beside
the records is not the one they write.

A sweep exits with its most urgent job outcome: interrupted, then failed, refused, diverged; 0 when every job
completed (also when a re-run found nothing left to do).
"""

from __future__ import annotations

COMPLETED = 0
FAILED = 1  # a bug: a traceback in the run's error.txt (a sweep: a job failed, or left no record)
REFUSED = 2  # bad input, refused in one line before anything ran (a sweep: a job's configuration was refused)
DIVERGED = 3  # non-finite training (a sweep: a job diverged; the other jobs still ran)
INTERRUPTED = 130  # SIGINT or SIGTERM (128 + SIGINT, as a shell reports Ctrl-C): checkpointed, resume command printed

# A sweep's exit code: the first of these statuses that one of its runs has (sweep.summary.statuses).
SWEEP_PRECEDENCE = (
    ("interrupted", INTERRUPTED),
    ("failed", FAILED),
    ("unfinished", FAILED),
    ("refused", REFUSED),
    ("diverged", DIVERGED),
)


def of_sweep(statuses) -> int:
    """The exit code of a sweep whose runs have these statuses."""
    found = set(statuses)
    return next((code for status, code in SWEEP_PRECEDENCE if status in found), COMPLETED)
