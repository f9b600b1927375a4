# The two commands of the README: `make demo` runs the main job, `make test` runs the test suite.
# Both build .venv from scratch when it is missing (torch pinned to the CPU build found on local disk).
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0

.PHONY: demo test setup bench-cpu clean

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q "$(TORCH_PIN)"
	$(VPY) -m pip install -q -e ".[test]"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VPY) -m kvcanary demo

test: setup
	$(VPY) -m pytest -q

bench-cpu: setup
	$(VPY) bench/bench_reference.py

clean:
	rm -rf $(VENV) build *.egg-info
