# The two commands of the README: `make demo` runs the main job, `make test` runs the test suite (with the lint
# and type checks). Both build .venv from scratch when it is missing (torch pinned to its CPU build: the CUDA
# build is several GB; a GPU machine brings its own torch and CuPy, see README).
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0

.PHONY: demo demo-transformers test lint setup bench-cpu gpu-wheels clean

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q "$(TORCH_PIN)"
	$(VPY) -m pip install -q -e ".[test]"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VPY) -m kvcanary demo

# The same on a real engine: HF transformers' continuous batching with bugs planted in it.
demo-transformers: setup
	$(VPY) -m kvcanary demo --engine transformers

lint: setup
	$(VPY) -m ruff check .
	$(VPY) -m mypy

test: lint
	$(VPY) -m pytest -q

bench-cpu: setup
	$(VPY) bench/bench_reference.py

# The wheel tests/gpu/run_all.sh installs on a device machine, which has no network: the transformers version the
# integration is pinned to (.venv has it from pyproject.toml's test extra). Carry .whl/ with the device call.
gpu-wheels: setup
	v=$$($(VPY) -c "import importlib.metadata as m; print(m.version('transformers'))") && \
	$(VPY) -m pip download -q --no-deps -d .whl "transformers==$$v"

clean:
	rm -rf $(VENV) build *.egg-info
