# Two entry points on a fresh machine (Python 3.11+, Java 17+):
#   make demo   set up .venv and run the main job on the embedded default (local Spark + local Delta store)
#   make test   set up .venv and run the whole test suite
VENV ?= .venv
PYTHON ?= python3
STAMP := $(VENV)/.installed-stamp

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e ".[dev]" --config-settings editable_mode=compat
	touch $(STAMP)

.PHONY: setup demo test test-fast lint bench
setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/spark-ckpt demo --seconds 60

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n 2 --durations=15

test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n 2 -m "not spark and not slow" --durations=15

lint: $(STAMP)
	$(VENV)/bin/ruff check spark_ckpt datasources tests bench notebooks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

bench: $(STAMP)
	$(VENV)/bin/python bench/engine.py
	$(VENV)/bin/python bench/pipeline.py
