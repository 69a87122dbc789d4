"""TensorBoard: the run's writer and its scalar tags (summaries.py), attention maps as images (images.py) and the
HParams experiment of a sweep (hparams.py). Written with tensorboardX; no TensorFlow.

The swept keys reach hparams.declare from its caller (cli reads them from the sweep's multirun.yaml through
sweep.definition.sweep_values): nothing here reads a sweep's files.
"""
