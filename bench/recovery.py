"""Recovery bench (#16): from a SIGKILL of the executor's Python workers to the next completed
checkpoint, with 10M keys of state (``bench/runbench/recovery.py``, ``bench/README.md``,
section "Recovery")::

    .venv/bin/python bench/recovery.py            # 5 kills, writes bench/results/recovery.json
    .venv/bin/python bench/recovery.py --quick    # 1M keys, 2 kills
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: runbench, benchcommon

from runbench.recovery import main

if __name__ == "__main__":
    sys.exit(main())
