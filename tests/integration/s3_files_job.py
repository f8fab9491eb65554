"""#42's files source on object storage, as a user runs it, in a process whose environment
points at the test's S3 endpoint::

    python tests/integration/s3_files_job.py LANDING ROOT SAVEPOINTS OUT NEW_ROOT

A pipeline at ROOT counts the JSON-lines files in LANDING per ``user_id`` into OUT, deleting
each file once a checkpoint covers it (``cleanSource=delete``), and stops with a drained
savepoint into SAVEPOINTS once it has read ``FIRST`` rows. The test then lands more files and
the job, run again with ``--restore SAVEPOINT``, restores a pipeline at NEW_ROOT from it and
counts what is there. Any location may be local or ``s3://``. Prints one JSON line; exit
status 0 when every run ended without failures."""

from __future__ import annotations

import json
import sys
import time

from spark_ckpt import CheckpointConfig, Pipeline, RunningCount, local_session
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.runtime.restore_settings import RestoreSettings


def source(landing: str) -> dict[str, object]:
    return {
        "source": "files",
        "path": landing,
        "format": "json",
        "schema": "user_id long",
        "channels": 2,
        "maxFilesPerTrigger": 2,
        "cleanSource": "delete",
    }


def read_by_checkpoints(root: str) -> int:
    """The rows the latest completed checkpoint of *root* covers."""
    latest = DeltaCheckpointStore(root).latest_completed()
    return 0 if latest is None else sum(latest.offsets().values())


def first(landing: str, root: str, savepoints: str, out: str, rows: int) -> dict[str, object]:
    """Read until *rows* rows went through, then stop with a savepoint."""
    spark = local_session("s3-files", "local[2]")
    try:
        options = {"checkpoint.interval": "300ms", "savepoint.dir": savepoints}
        pipeline = Pipeline(
            spark, "files", config=CheckpointConfig.from_options(options), root=root
        )
        run = pipeline.start(source(landing), RunningCount(), output=out, trigger_s=0.3)
        try:
            deadline = time.monotonic() + 240
            while read_by_checkpoints(root) < rows:
                assert time.monotonic() < deadline, "the rows were not checkpointed in time"
                time.sleep(0.3)
            savepoint = run.stop(savepoint=True, drain=True, timeout_s=240)
        finally:
            if run.query.isActive:
                run.query.stop()
        assert savepoint is not None and savepoint.is_savepoint
        return {"savepoint": pipeline.client.savepoint_path(savepoint)}
    finally:
        spark.stop()


def restored(landing: str, root: str, savepoint: str, out: str) -> dict[str, object]:
    spark = local_session("s3-files", "local[2]")
    try:
        config = CheckpointConfig.from_options({"checkpoint.interval": "300ms"})
        result = Pipeline(spark, "files", config=config, root=root).run(
            source(landing),
            RunningCount(),
            output=out,
            available_now=True,
            restore=RestoreSettings.savepoint(savepoint),
        )
    finally:
        spark.stop()
    assert not result.failures and result.restarts == 0, result
    return {"restored_from": list(result.restored_from)}


def main(argv: list[str]) -> int:
    if argv[0] == "--restore":
        _, savepoint, landing, root, out = argv
        print(json.dumps(restored(landing, root, savepoint, out)))
    else:
        landing, root, savepoints, out, rows = argv
        print(json.dumps(first(landing, root, savepoints, out, int(rows))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
