"""Overhead bench (#16): checkpoints every 1 s against off on the saturated production path,
repetitions interleaved, with the spread reported (``bench/runbench/overhead.py``,
``bench/README.md``, section "Overhead and scaling")::

    .venv/bin/python bench/overhead.py            # full run, writes bench/results/overhead.json
    .venv/bin/python bench/overhead.py --quick    # smoke run (~3 min)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: runbench, benchcommon

from runbench.overhead import main

if __name__ == "__main__":
    sys.exit(main())
