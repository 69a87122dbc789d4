#!/usr/bin/env bash
# The checks of one call on a lent GPU, most important first, each bounded by `timeout` so that a hang loses
# only itself: the train steps against the hand-written reference (timed and profiled, scripts/bench_gpu.py),
# the embedding gradient's forms (scripts/bench_embedding_grad.py),
# the Pallas kernels compiled for real (tests/backends/test_pallas_on_device.py), the numerics suite on the GPU, then
# the fused-kernel steps at T=8192. Logs go to $OUT (./device-out when unset). Needs attnlab's dependencies
# importable (PYTHONPATH may carry them); attnlab itself is taken from src/, with configs/ linked in as the
# package attnlab.configs that an install maps it to (pyproject.toml), the link removed on exit.
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ ! -e src/attnlab/configs ]; then
  ln -s ../../configs src/attnlab/configs && trap 'rm -f src/attnlab/configs' EXIT
fi
py=${PYTHON:-python3}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/device.txt"
$py -c 'import sys, jax, flax, optax, attnlab.cli
print("python", sys.version.split()[0], "jax", jax.__version__, "flax", flax.__version__, "optax", optax.__version__)
print(jax.devices())' 2>&1 | tee -a "$OUT/device.txt" || exit 1

timeout 300 $py scripts/bench_gpu.py --normalizers softmax --profile /tmp/traces 2>&1 | tee "$OUT/bench_softmax.md"
timeout 60 $py scripts/bench_embedding_grad.py 2>&1 | tee "$OUT/embedding_grad.txt"
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # several test processes share the GPU
timeout 60 $py -m pytest -q -p no:cacheprovider tests/backends/test_pallas_on_device.py 2>&1 | tail -25 | tee "$OUT/pallas.txt"
# SIGINT at the limit, so that pytest still prints which tests failed before it stops.
timeout -s INT -k 15 200 $py -m pytest -q -p no:cacheprovider -p no:benchmark -m numerics -n 8 -rfE --tb=short \
  --ignore=tests/backends/test_pallas_on_device.py > "$OUT/numerics.txt" 2>&1; tail -60 "$OUT/numerics.txt"
unset XLA_PYTHON_CLIENT_PREALLOCATE
timeout 90 $py scripts/bench_gpu.py --shapes 4x8192 --normalizers linear@pallas,sigmoid@pallas --no-float32 \
  2>&1 | tee "$OUT/bench_pallas.md"
