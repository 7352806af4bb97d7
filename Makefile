# The two set-up commands of the README. Both create the virtual environment on first use.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $(STAMP)

# Prewarm + train the CPU demo locally; prints the init report at the end.
demo: $(STAMP)
	$(VENV)/bin/jaxwarm launch configs/demo.yaml --local

# The whole suite; tests that need SLURM start the project's own dev cluster.
test: $(STAMP)
	$(VENV)/bin/python -m pytest -q
