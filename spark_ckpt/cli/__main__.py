"""``python -m spark_ckpt.cli …``: the same as the ``spark-ckpt`` console script."""

import sys

from spark_ckpt.cli import main

sys.exit(main())
