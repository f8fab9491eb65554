"""Graphs bench: two generated inputs joined by spark-ckpt's ``IntervalJoin`` against Spark's
own stream-stream join, a one-stage job run as a one-input graph against the same job written
as today, and a job of two keyed stages (per-user counts, then per-country windowed sums)
against Spark chaining two stateful operators in one query (``bench/runbench/graphbench.py``,
``bench/README.md``, section "Graphs")::

    .venv/bin/python bench/graphs.py            # full run, writes bench/results/graphs.json
    .venv/bin/python bench/graphs.py --quick    # smoke run, writes /tmp/graphs_quick.json
    .venv/bin/python bench/graphs.py --lines spark-ckpt/join,spark-join --out /tmp/join.json
    .venv/bin/python bench/graphs.py --lines stages/spark-ckpt,stages/spark --out /tmp/st.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: runbench, benchcommon

from runbench.graphbench import main

if __name__ == "__main__":
    sys.exit(main())
