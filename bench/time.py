"""Time bench (#41): event-time windows against Spark's own window aggregation and against
``transformWithStateInPandas`` with event-time timers, timers fired per second, and state
size over new keys with a state TTL against without (``bench/runbench/timebench.py``,
``bench/README.md``, section "Time")::

    .venv/bin/python bench/time.py            # full run, writes bench/results/time.json
    .venv/bin/python bench/time.py --quick    # smoke run, writes /tmp/time_quick.json
    .venv/bin/python bench/time.py --only ttl --out /tmp/ttl.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: runbench, benchcommon

from runbench.timebench import main

if __name__ == "__main__":
    sys.exit(main())
