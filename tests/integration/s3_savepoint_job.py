"""#42's savepoints across stores, as a user runs them, in a process whose environment
points at the test's S3 endpoint::

    python tests/integration/s3_savepoint_job.py FROM_ROOT FROM_SAVEPOINTS TO_ROOT OUT

A pipeline at FROM_ROOT counts the generator's first 120 rows per channel into OUT and
stops with a savepoint into FROM_SAVEPOINTS; a pipeline at TO_ROOT (the other store) restores
from that savepoint at parallelism 3 and counts up to 300 rows per channel into OUT. Any of
them may be local or ``s3://``. Prints the savepoint's path as one JSON line; exit status 0
when every run ended without failures."""

from __future__ import annotations

import json
import sys

from spark_ckpt import CheckpointConfig, Pipeline, RunningCount, local_session
from spark_ckpt.runtime.restore_settings import RestoreSettings

SEED, KEYS = 7, 25


def source(backlog: int) -> dict[str, object]:
    return {
        "source": "generator",
        "seed": SEED,
        "channels": 2,
        "rate": 0,
        "backlog": backlog,
        "keys": KEYS,
    }


def main(argv: list[str]) -> int:
    from_root, savepoints, to_root, out = argv
    spark = local_session("s3-savepoints", "local[2]")
    try:
        options = {"checkpoint.interval": "300ms", "savepoint.dir": savepoints}
        first = Pipeline(
            spark, "counts", config=CheckpointConfig.from_options(options), root=from_root
        )
        run = first.start(
            source(120), RunningCount("counter", "user_id"), output=out, trigger_s=0.3
        )
        try:
            first.client.checkpoint(timeout_s=240)
            savepoint = run.stop(savepoint=True, drain=True, timeout_s=240)
        finally:
            if run.query.isActive:
                run.query.stop()
        assert savepoint is not None and savepoint.is_savepoint
        path = first.client.savepoint_path(savepoint)
        config = CheckpointConfig.from_options({"checkpoint.interval": "300ms"})
        second = Pipeline(spark, "counts", config=config, root=to_root)
        result = second.run(
            source(300),
            RunningCount("counter", "user_id"),
            output=out,
            parallelism=3,
            available_now=True,
            restore=RestoreSettings.savepoint(path),
        )
    finally:
        spark.stop()
    print(json.dumps({"savepoint": path, "restored_from": list(result.restored_from)}))
    return 0 if not result.failures and result.restarts == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
