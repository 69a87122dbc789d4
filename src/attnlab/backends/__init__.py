"""How attention is computed: the mask every normalizer reads, the backends a normalizer runs on (dense, blockwise,
cuDNN's fused kernels, Pallas) and the choice among them (impl). Normalizers declare what they can run; this package
knows nothing of any one normalizer."""
