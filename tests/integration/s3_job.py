"""#42's first scenario as a user runs it, in a process of its own whose environment points
at the test's S3 endpoint (``AWS_ENDPOINT_URL`` and the credentials, set before the JVM and
its Python workers start, as on a cluster)::

    python tests/integration/s3_job.py ROOT OUT SOURCE PLACEMENT

A Delta source at SOURCE (2 channels), a running count per ``user_id``, everything read
and committed on the endpoint, ``available_now=True``. Prints the run's result as one JSON
line; exit status 0 when it ended without failures.

With ``SPARK_CKPT_TEST_STORAGE_OPTIONS`` set (a JSON object of delta-rs keys), the
environment has no ``AWS_*`` variables and the job gives those options to
``Pipeline(..., storage_options=...)`` instead; it then also prints the query's plan and
progress, so the test can check that the options show in neither."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

from spark_ckpt import CheckpointConfig, Pipeline, RunningCount, local_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def main(argv: list[str]) -> int:
    root, out, source, placement = argv
    spark = local_session("s3-job", "local[2]")
    try:
        config = CheckpointConfig.from_options({"checkpoint.interval": "300ms"})
        explicit = os.environ.get("SPARK_CKPT_TEST_STORAGE_OPTIONS")
        if explicit is not None:
            assert not any(k.startswith("AWS_") for k in os.environ), "AWS_* in the environment"
            return with_storage_options(spark, config, json.loads(explicit), argv)
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


def with_storage_options(
    spark: SparkSession, config: CheckpointConfig, options: dict[str, str], argv: list[str]
) -> int:
    """The same job with explicit storage options and no ``AWS_*`` environment; prints the
    plan (``explain``) and the last progress too."""
    root, out, source, placement = argv
    pipeline = Pipeline(spark, "s3", config=config, root=root, storage_options=options)
    run = pipeline.start(
        {"source": "delta", "path": source, "channels": 2},
        RunningCount("counter", "user_id"),
        output=out,
        available_now=True,
        placement=placement,
    )
    run.await_termination()
    run.query.explain(extended=True)
    print(str(run.query.lastProgress))
    completed = pipeline.client.checkpoints()
    print(json.dumps({"checkpoints": len(completed), "exception": str(run.query.exception())}))
    return 0 if run.query.exception() is None and completed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
