# The set-up commands of the README. Each creates the virtual environment on first use.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
# uv installs the packages of .venv and of every leg (testing/legs.py): seconds per venv from
# its cache, where pip took a minute. It comes from PyPI into .venv, by pip, the one thing
# pip installs here.
UV := $(VENV)/bin/uv
UV_INSTALL := $(UV) pip install --quiet --system-certs

# Every Python that make runs writes the bytecode of the modules it imports (__pycache__),
# once. Where PYTHONDONTWRITEBYTECODE is set (this development machine sets it) no process
# writes what it compiles: each of the suite's hundreds of processes compiled jaxwarm's, the
# tests' and bench's modules from source (0.75 CPU-s of a one-process launch's 12), and
# installing with --compile-bytecode instead compiled all ~34,000 files of .venv and the legs
# (~170 CPU-s of a fresh clone's set-up), of which the suite imports about a fifth.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo check lint types pure test legs matrix maxtext

$(UV):
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet uv

$(STAMP): pyproject.toml | $(UV)
	$(UV_INSTALL) --python $(VENV)/bin/python -e '.[test]'
	touch $(STAMP)

# Prewarm + train the CPU demo locally; prints the init report at the end.
demo: $(STAMP)
	$(VENV)/bin/jaxwarm launch configs/demo.yaml --local

# One venv per tested jax beyond the main venv's, and MaxText's (testing/legs.py), under
# .venvs/; a leg whose Python is not installed is skipped (and the tests say so).
# testing/legs.py needs no more than the standard library, so the legs build beside .venv
# (`make test`).
legs: | $(UV)
	$(PYTHON) -m testing.legs build

# The fast tier (under a minute): lint and import order (ruff), the types of every module
# of the package (mypy), and the pure tests: none starts a JAX process, the CLI or SLURM.
# mypy and the tests each keep one core busy: side by side, each one's output in one piece.
check: $(STAMP)
	$(MAKE) --no-print-directory -j3 --output-sync=target lint types pure

lint: $(STAMP)
	$(VENV)/bin/ruff check .

types: $(STAMP)
	$(VENV)/bin/mypy

pure: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m "not e2e and not slurm"

# The whole suite, every tested jax and MaxText included, on TEST_WORKERS parallel pytest-xdist workers
# (tests/conftest.py: which tests share a worker, and the order work is handed out in);
# tests that need SLURM start the project's own dev cluster. .venv and the legs are built
# side by side first. Then the tests marked `alone` (the 64-rank launch), one at a time with
# nothing beside them: in the parallel suite they starved the other tests' trainers.
TEST_WORKERS ?= 4
test:
	$(MAKE) --no-print-directory -j2 $(STAMP) legs
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not alone" --durations=15
	$(VENV)/bin/python -m pytest -q -m alone

# The key matrix, the demo and a bundle round trip on every tested jax beyond 0.10.2.
matrix: $(STAMP) legs
	$(VENV)/bin/python -m pytest -q tests/test_jax_versions.py

# MaxText from PyPI, unchanged, wrapped by examples/maxtext: builds (or reuses) .venvs/maxtext
# (Python 3.12/3.13, examples/maxtext/requirements.txt) and runs its test alone: HITs on 2
# processes on the SLURM dev cluster, and again after a requeue. `make test` builds the same
# venv (with the legs) and runs it in the suite.
maxtext: $(STAMP)
	$(VENV)/bin/python -m testing.legs build maxtext
	$(VENV)/bin/python -m pytest -q tests/test_maxtext.py
