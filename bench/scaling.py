"""Scaling bench (#16): a keyed running count with 1 s exactly-once checkpoints at 100k and 10M
keys, rows/s at local[1] and local[2] (one subprocess per cell), next to Spark's own JVM
``groupBy(key).count()`` with a ``checkpointLocation``, and the driver's peak RSS
(``bench/runbench/scaling.py``, ``bench/README.md``, section "Scaling")::

    .venv/bin/python bench/scaling.py            # full run, writes bench/results/scaling.json
    .venv/bin/python bench/scaling.py --quick    # smoke run (~6 min)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: runbench, benchcommon

from runbench.scaling import main

if __name__ == "__main__":
    sys.exit(main())
