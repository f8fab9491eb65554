# Two entry points on a fresh machine (Python 3.11+, Java 17+):
#   make demo   set up .venv and run the main job on the embedded default (local Spark + local Delta store)
#   make test   set up .venv and run the whole test suite
VENV ?= .venv
PYTHON ?= python3
STAMP := $(VENV)/.installed-stamp
# The oldest supported PySpark, in a venv of its own: `make test` runs the tests marked
# `compat` there too (what differs between PySpark versions), the whole suite in .venv on the
# newest one.
NEWEST_PYSPARK ?= pyspark[connect]>=4.3,<4.4
COMPAT_PYSPARK ?= pyspark[connect]>=4.2,<4.3
COMPAT_VENV ?= .venv-pyspark4.2
COMPAT_STAMP := $(COMPAT_VENV)/.installed-stamp

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e ".[dev]" "$(NEWEST_PYSPARK)" --config-settings editable_mode=compat
	touch $(STAMP)

$(COMPAT_STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/pip install -q --upgrade pip
	$(COMPAT_VENV)/bin/pip install -q -e ".[dev]" "$(COMPAT_PYSPARK)" --config-settings editable_mode=compat
	touch $(COMPAT_STAMP)

.PHONY: setup bytecode browser demo test test-compat test-fast lint bench
setup: $(STAMP)

# Headless Chromium for the checkpoint page's browser test: Debian's package, installed when
# missing and this runs as root (CI); elsewhere that test is skipped, and fails under CI=true.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    apt-get update -q >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } || \
	  echo "no chromium (as root: apt-get install chromium): the browser test will not run"

# Bytecode of the project's own modules, brought up to date before every run: the editable
# install imports them from this directory, and where PYTHONDONTWRITEBYTECODE=1 is set no
# Python process writes it, so every one (Spark's workers, the source runner, the subtask
# hosts) compiled them again: about 4 CPU-seconds per start of a job.
bytecode: $(STAMP)
	$(VENV)/bin/python -m compileall -q spark_ckpt datasources pyspark_ckpt_*.py

demo: bytecode
	$(VENV)/bin/spark-ckpt demo --seconds 60

# pytest caches the test modules it rewrites (assertions) as bytecode too, unless
# PYTHONDONTWRITEBYTECODE is set: then each of its processes rewrote and compiled them all again
# (about 7 CPU-seconds of collection per process).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/python -m pytest -q -n 2 --durations=15

test: bytecode browser
	@$(VENV)/bin/python -c "import pyspark; print('the whole suite on PySpark', pyspark.__version__)"
	$(PYTEST)
	$(MAKE) --no-print-directory test-compat

# The tests marked `compat` on the oldest supported PySpark (COMPAT_PYSPARK).
test-compat: $(COMPAT_STAMP) bytecode
	@$(COMPAT_VENV)/bin/python -c "import pyspark; print('the compat tests on PySpark', pyspark.__version__)"
	env -u PYTHONDONTWRITEBYTECODE $(COMPAT_VENV)/bin/python -m pytest -q -n 2 --durations=5 -m compat

test-fast: bytecode
	$(PYTEST) -m "not spark and not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check spark_ckpt datasources tests bench notebooks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

bench: bytecode
	$(VENV)/bin/python bench/engine.py
	$(VENV)/bin/python bench/pipeline.py
