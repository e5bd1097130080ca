# The two commands a new machine needs (README): `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: help venv test test-unit demo lock bench clean

help:
	@echo "make demo   build the torch example and run it twice; show the runs are bitwise identical"
	@echo "make test   the whole test suite on a real Docker Engine (installs what it needs)"
	@echo "make lock   re-resolve requirements.lock (the project's own environment)"
	@echo "make bench  the benchmarks in bench/ (figures for docs/benchmarks.md)"

# The project's own environment, from its own lock, hashes required.
# setup.py builds one C extension (hermetic/data/_filehash.c); ensure-build-deps
# installs its compiler and headers when missing (it is optional: see setup.py).
$(STAMP): requirements.lock pyproject.toml setup.py hermetic/data/_filehash.c
	scripts/ensure-build-deps $(PY)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes --no-deps -r requirements.lock
	@# setuptools announces every editable install with an "Editable installation." notice
	@# (InformationOnly, which pip prints as a warning); it says nothing about this project.
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	@touch $@

venv: $(STAMP)

test: $(STAMP)
	scripts/ensure-test-deps
	$(BIN)/python -m pytest -ra $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(BIN)/python -m pytest -ra -m "not docker and not registry and not slow and not slurm" $(PYTEST_ARGS)

demo: $(STAMP)
	scripts/ensure-test-deps
	PATH="$(CURDIR)/$(BIN):$$PATH" scripts/demo

lock: $(STAMP)
	$(BIN)/uv pip compile pyproject.toml requirements.in --extra test --generate-hashes \
	  --universal --python-version 3.10 -o requirements.lock

bench: $(STAMP)
	scripts/ensure-test-deps
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
