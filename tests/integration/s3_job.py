"""#42's first scenario as a user runs it, in a process of its own whose environment points
at the test's S3 endpoint (``AWS_ENDPOINT_URL`` and the credentials, set before the JVM and
its Python workers start, as on a cluster)::

    python tests/integration/s3_job.py ROOT OUT SOURCE PLACEMENT

A Delta source at SOURCE (2 channels), a running count per ``user_id``, everything read
and committed on the endpoint, ``available_now=True``. Prints the run's result as one JSON
line; exit status 0 when it ended without failures."""

from __future__ import annotations

import json
import sys

from spark_ckpt import CheckpointConfig, Pipeline, RunningCount, local_session


def main(argv: list[str]) -> int:
    root, out, source, placement = argv
    spark = local_session("s3-job", "local[2]")
    try:
        config = CheckpointConfig.from_options({"checkpoint.interval": "300ms"})
        result = Pipeline(spark, "s3", config=config, root=root).run(
            {"source": "delta", "path": source, "channels": 2},
            RunningCount("counter", "user_id"),
            output=out,
            available_now=True,
            placement=placement,
        )
    finally:
        spark.stop()
    print(
        json.dumps(
            {
                "checkpoints": result.checkpoints_completed,
                "restarts": result.restarts,
                "failures": [str(f) for f in result.failures],
            }
        )
    )
    return 0 if not result.failures else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
