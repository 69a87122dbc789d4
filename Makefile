# The two commands: `make run` (default experiment on CPU) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-long test-slow test-profile coverage test-numerics test-newest test-gpu-program bench clean chromium

# uv installs into each environment (a venv with pip, as `python -m venv` makes it): the test extras in ~15 s from
# empty caches where pip took ~60 s, and a second environment links the packages the first downloaded (BENCHMARKS.md).
# Compiled to bytecode at install, as pip does: where PYTHONDONTWRITEBYTECODE is set, a process would otherwise compile
# jax's source at every start (`import jax, flax.nnx`: 4.6 s of CPU, 2.0 s from bytecode).
UV_VERSION := 0.13.9
# $(call venv,PYTHON,DIR,UV PIP INSTALL ARGUMENTS)
venv = { test -x $(2)/bin/python || $(1) -m venv $(2); } && \
	$(2)/bin/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION) && \
	$(2)/bin/uv pip install --quiet --compile-bytecode --python $(2)/bin/python $(3)

$(STAMP): pyproject.toml
	$(call venv,$(PYTHON),$(VENV),-e '.[test]')
	touch $(STAMP)

run: $(STAMP)
	JAX_PLATFORMS=cpu $(VENV)/bin/attnlab-train accelerator=cpu

# The real-browser tests (tests/board/test_tensorboard.py) need Debian's chromium: installed here when absent (CI runs
# as root with the package index reachable); where it cannot be, make test stops and says so, never skips them.
chromium:
	@command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium) || \
	  { echo "make test: the headless-browser tests need chromium; install it: apt-get install -y chromium" >&2; exit 1; }

# The suite's programs are tiny and its time is XLA's compile (a 4-step run: ~70% compile), most of it LLVM's
# optimisation of the CPU code: at -O0 the suite takes ~27% less CPU time (BENCHMARKS.md) and computes the same HLO.
# Runs and benchmarks keep XLA's default level.
# XLA's CPU element-wise emitters of before its MLIR fusion emitters (--xla_cpu_use_fusion_emitters=false) compile the
# same HLO in about half the time of those, at -O0 too: the suite takes ~30% less CPU time (BENCHMARKS.md). jax 0.12's
# XLA has only the new emitters and aborts on an unknown flag, so each environment is asked once, in a process of its
# own, whether its XLA knows it.
LEGACY_EMITTERS := --xla_cpu_use_fusion_emitters=false
test_xla_flags = XLA_FLAGS="$$XLA_FLAGS --xla_backend_optimization_level=0$(shell XLA_FLAGS=$(LEGACY_EMITTERS) \
	JAX_PLATFORMS=cpu $(1) -c 'import jax; jax.devices()' >/dev/null 2>&1 && echo ' $(LEGACY_EMITTERS)')"

# The suite's programs are lowered without the Python traceback of every operation in their locations (a
# message still names the line that failed): 3-5% less CPU time on a compile-bound test file (BENCHMARKS.md).
TEST_ENV := JAX_PLATFORMS=cpu JAX_INCLUDE_FULL_TRACEBACKS_IN_LOCATIONS=false
PYTEST := -m pytest -n 2 -q

# ruff (pinned in the test extra, configured in pyproject.toml) checks the format and lints before the suite runs.
test: $(STAMP) chromium
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(TEST_ENV) $(call test_xla_flags,$(PY)) $(PY) $(PYTEST) --durations=15

# The end-to-end variations and the larger property draws (tests/README.md); CI runs them after it (.ci/run).
test-long: $(STAMP)
	$(TEST_ENV) $(call test_xla_flags,$(PY)) $(PY) $(PYTEST) -m long --durations=10

test-slow: $(STAMP)
	$(TEST_ENV) $(call test_xla_flags,$(PY)) $(PY) $(PYTEST) -m slow

# What each test costs, by folder and fixture, against the suite's budget (scripts/test_profile.py).
PROFILE_DIR ?= .test-profile
test-profile: $(STAMP)
	rm -rf $(PROFILE_DIR)
	ATTNLAB_TEST_PROFILE=$(abspath $(PROFILE_DIR)) $(TEST_ENV) $(call test_xla_flags,$(PY)) $(PY) $(PYTEST) \
	  -p profile_plugin $(PYTEST_ARGS)
	$(PY) scripts/test_profile.py $(PROFILE_DIR)

# Line coverage of src/attnlab by the default suite then -m long, their subprocesses included ([tool.coverage] in
# pyproject.toml); every process writes its data under COVERAGE_DIR, which pytest-cov combines at each run's end.
COVERAGE_DIR ?= .coverage-data
COVERAGE_ENV = COVERAGE_FILE=$(abspath $(COVERAGE_DIR))/.coverage
coverage: $(STAMP)
	$(VENV)/bin/uv pip install --quiet --python $(PY) -e '.[test,coverage]'
	rm -rf $(COVERAGE_DIR) && mkdir -p $(COVERAGE_DIR)
	$(COVERAGE_ENV) $(TEST_ENV) $(call test_xla_flags,$(PY)) $(PY) $(PYTEST) \
	  --cov --cov-report= $(PYTEST_ARGS)
	$(COVERAGE_ENV) $(TEST_ENV) $(call test_xla_flags,$(PY)) $(PY) $(PYTEST) \
	  -m long --cov --cov-append --cov-report= $(PYTEST_ARGS)
	$(COVERAGE_ENV) $(PY) -m coverage report

# The numerics tests (pytest -m numerics) on whatever accelerator JAX sees (a GPU if there is one).
test-numerics: $(STAMP)
	$(PY) -m pytest -q -m numerics

# The other end of the pins: Python 3.12 with the newest releases they admit (jax 0.12), the default suite.
# python3.12 from PATH, else pyenv's newest 3.12 (a pyenv shim answers only for the selected version).
PYTHON_NEWEST ?= $(firstword $(foreach p,python3.12 $(sort $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python)),\
	$(shell $(p) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null && echo $(p))))
NEWEST := .venv-newest

$(NEWEST)/.installed: pyproject.toml
	@test -n "$(PYTHON_NEWEST)" || { echo "test-newest: no Python 3.12 found (set PYTHON_NEWEST=...)"; exit 2; }
	$(call venv,$(PYTHON_NEWEST),$(NEWEST),--upgrade -e '.[test]')
	touch $@

# What a newer jax, flax, optax or orbax could change: every shipped normalizer against its float64 reference through
# the contract checker (tests/testing), the model, the backends (Pallas included), the heads, the statistics, the
# train steps and loop, checkpoints, the optimizer and the CLI's build. Not rerun here: the per-normalizer formula
# tests (the checker compares every shipped variant with the same references), the tasks' numpy data, and the config
# layer, launchers, reports, studies and TensorBoard files, which compute nothing those libraries compute.
NEWEST_TESTS := tests/testing tests/model tests/backends tests/heads tests/statistics tests/train \
	tests/normalizers/test_gradients.py tests/tasks/test_host_stream.py tests/test_steps.py tests/test_optim.py \
	tests/test_checkpoint.py tests/test_scored_positions.py tests/test_cli.py tests/test_accelerator.py

test-newest: $(NEWEST)/.installed
	$(NEWEST)/bin/python -c 'import jax, flax, sys; print(f"test-newest: Python {sys.version.split()[0]}, jax {jax.__version__}, flax {flax.__version__}")'
	$(NEWEST)/bin/ruff format --check .
	$(NEWEST)/bin/ruff check .
	$(TEST_ENV) $(call test_xla_flags,$(NEWEST)/bin/python) $(NEWEST)/bin/python $(PYTEST) --durations=15 $(NEWEST_TESTS)

# The train steps compiled for an H100 without a GPU (pytest -m gpu_program, scripts/gpu_program.py), in an
# environment of their own with the CUDA plugin of the jax installed there (about 3.2 GB of wheels).
GPU_PROGRAM := .venv-gpu

$(GPU_PROGRAM)/.installed: pyproject.toml
	$(call venv,$(PYTHON),$(GPU_PROGRAM),-e '.[test]')
	$(GPU_PROGRAM)/bin/uv pip install --quiet --compile-bytecode --python $(GPU_PROGRAM)/bin/python \
	  "jax[cuda12]==$$($(GPU_PROGRAM)/bin/python -c 'import jax; print(jax.__version__)')"
	touch $@

# XLA_FLAGS: scripts/gpu_program.py's DEVICELESS_XLA_FLAGS, set before the suite starts XLA.
test-gpu-program: $(GPU_PROGRAM)/.installed
	JAX_PLATFORMS=cpu XLA_FLAGS="$$XLA_FLAGS --xla_gpu_enable_cub_radix_sort=false" $(GPU_PROGRAM)/bin/python -m pytest -n 2 --dist loadfile -q -m gpu_program --durations=10

bench: $(STAMP)
	JAX_PLATFORMS=cpu $(PY) scripts/bench_attention.py
	JAX_PLATFORMS=cpu $(PY) scripts/bench_train.py

clean:
	rm -rf $(VENV) $(NEWEST) $(GPU_PROGRAM) outputs multirun
