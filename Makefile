# Quick start: `make demo` runs the main job, `make test` the tests. Both create .venv if missing,
# installing the local CPU build torch==2.13.0 first so pip never resolves another torch.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.medattn-installed

.PHONY: demo test test-slow lint bench-smoke clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps timm==1.0.31  # tests against real timm; its torchvision is a CUDA build
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/medattn demo

# The suite runs in one worker per core (pytest-xdist), each on one thread unless the user set OMP_NUM_THREADS /
# NUMBA_NUM_THREADS: the cores are shared out, never oversubscribed (16 min serial, about 10 on two cores).
test: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} NUMBA_NUM_THREADS=$${NUMBA_NUM_THREADS:-1} $(PY) -m pytest -n auto --durations=25

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

# Every script in benchmarks/ at a toy size, the slow ones included (tests/bench/test_benchmark_scripts.py; a few minutes).
bench-smoke: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -n auto -m '' tests/bench/test_benchmark_scripts.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) reports
