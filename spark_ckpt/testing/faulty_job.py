"""The main job with fail points: ``python -m spark_ckpt.testing.faulty_job [demo options]``.

:mod:`spark_ckpt.demo` as it is, with the components of :mod:`spark_ckpt.testing.faults`
(store, sink committer, source and operator that fail where a test arms them). Crash tests
and the chaos benchmark launch it (:mod:`spark_ckpt.testing.jobs`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from spark_ckpt.testing.faults import COMPONENTS


def main(argv: Sequence[str] | None = None) -> int:
    from spark_ckpt.demo import main as demo

    return demo(argv, components=COMPONENTS)


if __name__ == "__main__":  # as spark_ckpt.demo's: what escapes main ends in one line
    from spark_ckpt.demo import fail

    try:
        sys.exit(main())
    except Exception as e:
        sys.exit(fail(f"{type(e).__name__}: {e}", 1))
