"""Sweep bookkeeping, one concern a module: definition (multirun.yaml), naming (job directories), signals
(stopping on SIGINT/SIGTERM) and summary (a line per job, the sweep's outcome and exit code)."""
