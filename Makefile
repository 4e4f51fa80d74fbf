# dflash-gguf: every install step lives here, so a fresh machine needs only `make demo` / `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: setup test test-unit demo bench-convert clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'
	touch $@

test: setup
	$(PY) -m pytest -q

test-unit: setup
	$(PY) -m pytest -q -m "not integration and not upstream"

bench-convert: setup
	$(PY) benchmarks/bench_convert.py

clean:
	rm -rf build
