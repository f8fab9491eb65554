"""Overhead bench (#16): checkpoints every 1 s against off on the saturated production path,
repetitions interleaved, with the spread reported (``bench/runbench/overhead.py``,
``bench/runbench/alternating.py``, ``bench/README.md``, section "Overhead")::

    .venv/bin/python bench/overhead.py            # full run, writes bench/results/overhead.json
    .venv/bin/python bench/overhead.py --quick    # smoke run (~3 min)
    .venv/bin/python bench/overhead.py --alternating 30 --window 10   # inside one query

``--alternating`` writes ``bench/results/overhead.json`` too unless ``--out`` says otherwise
(its committed figures are ``bench/results/overhead_alternating.json``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: runbench, benchcommon

from runbench.overhead import main

if __name__ == "__main__":
    sys.exit(main())
