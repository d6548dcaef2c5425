# Every target depends on .venv, which is built from pyproject.toml on first use.
SHELL := /bin/bash
VERSION ?= n17
LAYOUT ?=
PROFILE ?=
EMBODIMENTS ?= all
SCHEDULER ?= threads
SNAPSHOT ?=
SYNTHETIC ?=
REVISION ?=
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# The pyenv shim for python3.12 exists but fails unless 3.12 is selected, so probe by running it.
PYTHON312 := $(shell for p in python3.12 $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12.*/bin/python3.12 2>/dev/null | sort -V -r); do \
	$$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && { echo $$p; break; }; done)

.PHONY: demo test simulator convert graph inspect bench clean-venv

$(STAMP): pyproject.toml
	@if [ -z "$(PYTHON312)" ]; then echo "No working python3.12 found on PATH or under pyenv: install Python 3.12 (e.g. 'pyenv install 3.12')" >&2; exit 1; fi
	@test -x $(PY) || $(PYTHON312) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@$(PY) -c "from tasks.numerics import kernels; print('C kernels:', kernels.build() or 'not built (no C compiler): the numpy packers give the same bytes, slower')"
	@$(PY) -c "from tasks.device import tensorbin; print('ttnn .tensorbin headers checked:', tensorbin.check_formats())" 2>/dev/null
	@$(PY) -c "from tasks.device import one_file; print('ttnn loads a tiled chunk where it lies:', one_file.ttnn_reads_in_place())" 2>/dev/null
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) -m pipeline demo

# A simulated Wormhole and Blackhole for the device tests, built from ../shared/vendor's ttsim source when it is there
# (devkit/simulator); without it (and without TT_METAL_SIMULATOR) the device tests skip and say why.
simulator: $(STAMP)
	$(PY) -m devkit.simulator build

# One worker per core (pytest-xdist), each test file on one worker so its module fixtures are built once; the files
# handed out longest first (tests/file_order.py), not xdist's default of the most tests first.
# The project's bytecode is compiled first: where PYTHONDONTWRITEBYTECODE is set (this machine sets it), each of the
# suite's ~200 `python -m pipeline` processes would otherwise compile every module it imports again (~0.15 s of CPU).
test: $(STAMP) simulator
	$(PY) -m compileall -q pipeline tasks devkit tests >/dev/null
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder --durations=15

convert: $(STAMP)
	$(PY) -m pipeline convert --version $(VERSION) $(if $(LAYOUT),--layout $(LAYOUT)) $(if $(PROFILE),--profile $(PROFILE)) --embodiments $(EMBODIMENTS) --scheduler $(SCHEDULER) $(if $(SNAPSHOT),--snapshot $(SNAPSHOT)) $(if $(SYNTHETIC),--synthetic $(SYNTHETIC)) $(if $(REVISION),--revision $(REVISION))

inspect: $(STAMP)
	$(PY) -m pipeline inspect --version $(VERSION) $(if $(SNAPSHOT),--snapshot $(SNAPSHOT)) $(if $(SYNTHETIC),--synthetic $(SYNTHETIC)) $(if $(REVISION),--revision $(REVISION))

graph: $(STAMP)
	$(PY) -m pipeline graph --version $(VERSION) $(if $(LAYOUT),--layout $(LAYOUT)) --embodiments $(EMBODIMENTS) --out build/graph-$(VERSION).svg $(if $(SNAPSHOT),--snapshot $(SNAPSHOT)) $(if $(SYNTHETIC),--synthetic $(SYNTHETIC)) $(if $(REVISION),--revision $(REVISION))

bench: $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) -m bench

clean-venv:
	rm -rf $(VENV)
