"""Pipeline benchmark: what exactly-once checkpointing costs a real Spark job, side by side.

The entry point of :mod:`pipelinebench` (``bench/pipelinebench/``, described there and in
``bench/README.md``, section "Pipeline")::

    .venv/bin/python bench/pipeline.py            # full run, writes bench/results/pipeline.json
    .venv/bin/python bench/pipeline.py --quick    # smoke run, ~2-3 min
    .venv/bin/python bench/pipeline.py --profile  # adds a cProfile'd query
    .venv/bin/python bench/pipeline.py --only lag --out /tmp/x.json   # --rate fixes the rate
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: pipelinebench, benchcommon

from pipelinebench.main import main

if __name__ == "__main__":
    sys.exit(main())
