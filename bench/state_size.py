"""State-size bench (#16): checkpoint time and bytes of a 10M-key state against a 100k-key
state under the same updates (a hot set of 100k keys), and the driver's RSS at both
(``bench/runbench/state_size.py``, ``bench/README.md``, section "State size")::

    .venv/bin/python bench/state_size.py            # full run, writes bench/results/state_size.json
    .venv/bin/python bench/state_size.py --quick    # smoke run (100k against 1M keys)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: runbench, benchcommon

from runbench.state_size import main

if __name__ == "__main__":
    sys.exit(main())
