# The two commands: `make run` (default experiment on CPU) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-slow test-numerics bench clean chromium

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	JAX_PLATFORMS=cpu $(VENV)/bin/attnlab-train accelerator=cpu

# The real-browser tests (tests/test_tensorboard.py) need Debian's chromium: installed here when absent (CI runs
# as root with the package index reachable); where it cannot be, make test stops and says so, never skips them.
chromium:
	@command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium) || \
	  { echo "make test: the headless-browser tests need chromium; install it: apt-get install -y chromium" >&2; exit 1; }

test: $(STAMP) chromium
	JAX_PLATFORMS=cpu $(PY) -m pytest -n 2 -q --durations=15

test-slow: $(STAMP)
	JAX_PLATFORMS=cpu $(PY) -m pytest -n 2 -q -m slow

# The numerics tests (pytest -m numerics) on whatever accelerator JAX sees (a GPU if there is one).
test-numerics: $(STAMP)
	$(PY) -m pytest -q -m numerics

bench: $(STAMP)
	JAX_PLATFORMS=cpu $(PY) scripts/bench_attention.py
	JAX_PLATFORMS=cpu $(PY) scripts/bench_train.py

clean:
	rm -rf $(VENV) outputs multirun
