# The two commands a new machine needs (README): `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: help venv test test-quick test-pythons demo lock bench clean

help:
	@echo "make demo        build the torch example and run it twice; show the runs are bitwise identical"
	@echo "make test        the whole test suite on a real Docker Engine, registry and Slurm (installs what it needs)"
	@echo "make test-quick  the inner loop: the tests that need no engine, base image, service or network"
	@echo "make test-pythons  test-quick on every CPython 3.10-3.13 found here, the OS's python3 included"
	@echo "make lock        re-resolve requirements.lock (the project's own environment)"
	@echo "make bench       the benchmarks in bench/ (figures for docs/benchmarks.md)"

# The project's own environment, from its own lock, hashes required.
# setup.py builds one C extension (hermetic/data/_filehash.c); ensure-build-deps
# installs its compiler and headers when missing (it is optional: see setup.py).
$(STAMP): requirements.lock pyproject.toml setup.py hermetic/data/_filehash.c
	scripts/ensure-build-deps $(PY)
	@# The venv is made without ensurepip (~5 s of a fresh clone's test): the lock brings pip, setuptools and
	@# wheel. uv (pinned in the lock, hash-checked) goes in first by the host's pip (its --python: pip >= 22.3),
	@# else by the venv's own from ensurepip; uv then installs the lock in seconds where pip takes minutes, and
	@# hermetic itself, editable (the hashes are required either way; pip is the fallback should uv fail).
	@if $(PY) -c 'import sys, pip; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (22, 3))' 2>/dev/null; then \
	  set -x; $(PY) -m venv --without-pip $(VENV) && $(PY) scripts/lock-entry uv requirements.lock > $(VENV)/uv.lock.txt \
	  && $(PY) -m pip --python $(BIN)/python install --quiet --require-hashes --no-deps -r $(VENV)/uv.lock.txt; \
	else \
	  set -x; $(PY) -m venv $(VENV) && $(PY) scripts/lock-entry uv requirements.lock > $(VENV)/uv.lock.txt \
	  && $(BIN)/pip install --quiet --require-hashes --no-deps -r $(VENV)/uv.lock.txt; \
	fi
	$(BIN)/uv pip install --quiet --python $(BIN)/python --require-hashes --no-deps -r requirements.lock \
	  || { $(BIN)/python -m ensurepip --default-pip >/dev/null \
	       && $(BIN)/python -m pip install --quiet --require-hashes --no-deps -r requirements.lock; }
	@# (pip, the fallback: setuptools' "Editable installation." notice is InformationOnly, which pip prints as a
	@# warning; it says nothing about this project)
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps --no-build-isolation -e . \
	  || PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet --no-deps \
	       --no-build-isolation -e .
	@touch $@

venv: $(STAMP)

# Bytecode: every `hermetic` a test starts would compile the package again where
# PYTHONDONTWRITEBYTECODE is set (~0.3 s of CPU each, a thousand times); it is written
# outside the tree instead (.cache/ is ignored), which also keeps pytest's rewritten tests.
# pytest's exit code passes through as it is: 5 ("no tests collected", e.g. a PYTEST_ARGS
# that selects nothing) fails the target like a failing test.
PYTEST  := env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(CURDIR)/.cache/pycache $(BIN)/python -m pytest

# The whole suite (CI's .ci/run), in two phases on one session cache (base, wheels, example images made
# once): every test but the `serial` ones on TEST_WORKERS workers (pytest-xdist), each test module whole
# on one worker (--dist loadfile: its fixtures made once), handed out in conftest's order (--no-loadscope-reorder:
# the quick ones first, then the longest modules first) -- most of an integration test is waiting on the
# engine, the registry or Slurm, and a third worker on two cores fills those waits; then the `serial`
# ones, which need the engine to themselves, in one process. A test that failed in the first phase is run
# again alone before the second: passing then, it is reported as a race (loudly) and does not fail the
# suite; failing again, it does. The 25 slowest steps are printed at the end
# of the first phase (docs/testing.md). pytest's exit code 5 ("no tests collected") of one phase is no
# failure when the other ran tests; of both, it is. TEST_WORKERS=0: the whole suite in one process, in
# order (the way to give PYTEST_ARGS a -m of its own).
# The tests' files (gigabytes: caches, cold builds) go to one directory per run (--basetemp), not pytest's
# numbered ones, whose cleanup removed an earlier run's at the first phase's exit (~15 s of disk between the
# phases): the first phase's are removed beside the second phase when it passed, the rest at the end; a
# failed run keeps them and says where.
TEST_WORKERS ?= 3
test: $(STAMP)
	scripts/ensure-test-deps
ifeq ($(TEST_WORKERS),0)
	$(PYTEST) -ra --durations=25 $(PYTEST_ARGS)
else
	@own=""; session="$${HERMETIC_TEST_SESSION_CACHE:-}"; \
	if [ -z "$$session" ]; then own=1; session=$$(mktemp -d "$${TMPDIR:-/tmp}/hermetic-test-session.XXXXXX"); fi; \
	export HERMETIC_TEST_SESSION_CACHE="$$session"; \
	files=$$(mktemp -d "$${TMPDIR:-/tmp}/hermetic-test-files.XXXXXX") || exit 1; cleaner=""; \
	echo "$(PYTEST) -ra --durations=25 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m 'not serial' --basetemp=$$files/parallel $(PYTEST_ARGS)"; \
	$(PYTEST) -ra --durations=25 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not serial" --basetemp="$$files/parallel" $(PYTEST_ARGS); first=$$?; \
	if [ $$first -eq 1 ]; then \
	  echo "make test: tests failed beside other workers; each again, alone (a failure there is a failure):"; \
	  $(PYTEST) -ra --lf --last-failed-no-failures none -m "not serial" --basetemp="$$files/alone" $(PYTEST_ARGS); again=$$?; \
	  if [ $$again -eq 0 ]; then first=0; \
	    echo "make test: WARNING: the tests above failed beside other workers and passed alone: a race between tests, or in hermetic, to look into (docs/testing.md)"; \
	  else first=$$again; fi; \
	elif [ $$first -eq 0 ] || [ $$first -eq 5 ]; then \
	  { rm -rf "$$files/parallel" & cleaner=$$!; }; \
	fi; \
	echo "$(PYTEST) -ra -m serial --basetemp=$$files/serial $(PYTEST_ARGS)"; \
	$(PYTEST) -ra -m serial --basetemp="$$files/serial" $(PYTEST_ARGS); second=$$?; \
	if [ -n "$$cleaner" ]; then wait $$cleaner; fi; \
	for rc in $$first $$second; do if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then \
	  echo "make test: the files of the tests that failed are kept in $$files"; exit $$rc; fi; done; \
	rm -rf "$$files"; \
	if [ $$first -eq 5 ] && [ $$second -eq 5 ]; then exit 5; fi; \
	if [ -n "$$own" ]; then rm -rf "$$session"; fi
endif

# The tests that need nothing outside one process (tests/conftest.py marks the others
# `integration`, from markers and fixtures), on every core (pytest-xdist: they are CPU-bound
# and share nothing); an engine socket that is not there catches a test that is marked wrong.
test-quick: $(STAMP)
	DOCKER_HOST=unix:///nonexistent/make-test-quick-starts-no-engine $(PYTEST) -ra -n auto -m "not integration" $(PYTEST_ARGS)

# test-quick again on each admitted CPython this machine has (scripts/test-pythons: which it ran, which it did
# not find), each in its own venv under .venvs/ from the same lock.
test-pythons:
	scripts/test-pythons $(PYTEST_ARGS)

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
	rm -rf $(VENV) .venvs .pytest_cache build *.egg-info
