"""``test_watermarks.py``'s late-output job under Spark Connect, as a script:
``connect_session("local[2]")`` starts a local Connect server in the script's own process,
which a test process holding a classic session cannot::

    python tests/integration/late_connect_job.py ROOT OUT LATE PLACEMENT

The job is the test's: the generator with its transform's jittered event time, a running
count, a 1 s bound, and the late rows into LATE. The test checks both tables against its
loop."""

from __future__ import annotations

import sys

from test_watermarks import BACKLOG, BOUND, source, transform

from spark_ckpt import (
    CheckpointConfig,
    Pipeline,
    RunningCount,
    WatermarkStrategy,
    connect_session,
)


def main(argv: list[str]) -> int:
    root, out, late, placement = argv
    spark = connect_session("local[2]", "late-connect")
    try:
        config = CheckpointConfig.from_options({"checkpoint.interval": "300ms"})
        result = Pipeline(spark, "late", config=config, root=root).run(
            source(BACKLOG),
            RunningCount("counter", "user_id"),
            output=out,
            available_now=True,
            transform=transform,
            placement=placement,
            watermark=WatermarkStrategy.for_bounded_out_of_orderness("ts", BOUND),
            late_output=late,
        )
    finally:
        spark.stop()
    return 0 if result.restarts == 0 and not result.failures else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
