"""TensorBoard: the run's writer and its scalar tags (summaries.py), attention maps as images (images.py) and the
HParams experiment of a sweep (hparams.py). Written with tensorboardX; no TensorFlow.

The swept keys and the choices of each config group reach hparams.declare from its caller (cli reads them through
sweep.definition.sweep_values and config.registry.catalogue): nothing here reads a sweep's files or a YAML.
"""
