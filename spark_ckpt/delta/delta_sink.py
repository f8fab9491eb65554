"""Exactly-once output into a Delta table: a two-phase-commit sink on delta-rs (``deltalake``),
after Flink's ``TwoPhaseCommitSinkFunction`` (and Arroyo's Delta sink).

1. **Stage** (task side, executors or driver; never loads the Delta table): output rows are
   encoded as they arrive into an in-progress Parquet file per (operator, subtask) under the
   table root, named uniquely and tagged by sink, so a sink only ever cleans up its own
   files. Nothing in the log references a staged file: Delta readers do not see it.
2. **Pre-commit** (the synchronous phase of checkpoint *n*) closes the in-progress file and
   seals the subtask's staged files into a
   :class:`~spark_ckpt.sinks.two_phase_commit.Transaction` (possibly empty) of
   :class:`~spark_ckpt.delta.staged_file.StagedFile` JSON strings. Steps 1 and 2 are the
   writer's (:class:`~spark_ckpt.delta.sink_writer.DeltaSinkWriter`).
3. **Commit** (the committer, :class:`~spark_ckpt.delta.sink_committer.DeltaSinkCommitter`,
   in the global committer on the driver side; steps 4 and 5 too): ``commit_checkpoint``
   makes every file of all transactions of checkpoint *n* visible in **one** Delta commit
   that records the app transaction ``spark-ckpt/<pipeline>`` at version *n*. ``commit``
   adds one transaction's files and leaves the version where it is.
4. **Abort / recover** delete staged files that never became part of the table.
5. **Roll back** (at a restore, before recover) removes this sink's output of checkpoints
   after the restored one, which the job replays.

Guarantees (the reasoning in ``docs/architecture.md``, *The Delta sink*):

* **Files are added at most once**, also under concurrent committers: every commit re-reads
  the table, drops the files already in it and commits on that snapshot without rebasing.
* **App version *n* means every transaction sealed at a checkpoint <= *n* is in the table**
  (a checkpoint's state carries every sealed, uncommitted transaction of every subtask), so
  ``commit_checkpoint`` for *n* is a no-op once the version is >= *n*. It must be given
  **all** transactions of the checkpoint in one call, and a pipeline writes a table through
  one sink vertex. The version only moves back at a roll back.
* **Nothing referenced is deleted**: a roll back only removes files from the table, and
  ``abort`` and ``recover`` delete only files no version of the table references, so every
  version reads until a ``VACUUM``. ``recover`` must not run concurrently with writers of the
  same sink: run it once per job (re)start, before any task writes.

Cost: one Delta commit per checkpoint, whatever the number of subtasks. The table is created
by the first commit that has files (protocol reader 1 / writer 2, UTC timestamps, not
partitioned). Errors of delta-rs, Arrow and the file system become
:class:`~spark_ckpt.errors.StoreError`; staged data that does not fit the table raises
:class:`~spark_ckpt.errors.ProtocolError` naming the columns.
"""

from __future__ import annotations

import pyarrow.fs as pafs

from spark_ckpt.delta.sink_committer import DEFAULT_MAX_ATTEMPTS, DeltaSinkCommitter
from spark_ckpt.delta.sink_target import DeltaSinkTarget
from spark_ckpt.delta.sink_writer import DEFAULT_TARGET_FILE_BYTES, DeltaSinkWriter


class DeltaSink:
    """A :class:`~spark_ckpt.sinks.two_phase_commit.TransactionalSink` into the Delta table at
    *table_uri*: a :class:`DeltaSinkWriter` and a :class:`DeltaSinkCommitter` over one
    :class:`DeltaSinkTarget` (see it for *pipeline*, *storage_options* and *filesystem*),
    for a process that runs tasks of the sink vertex and reads what was committed (the
    foreachBatch aligner) or does both (tests). A process that plays only one role builds
    only that one from a target. *target_file_bytes*: see :class:`DeltaSinkWriter`;
    *max_attempts*: see :class:`DeltaSinkCommitter`. Building it does not load the
    table."""

    def __init__(
        self,
        table_uri: str,
        *,
        pipeline: str,
        storage_options: dict[str, str] | None = None,
        filesystem: pafs.FileSystem | None = None,
        target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        self.target = DeltaSinkTarget(
            table_uri,
            pipeline=pipeline,
            storage_options=storage_options,
            filesystem=filesystem,
        )
        self.writer = DeltaSinkWriter(self.target, target_file_bytes=target_file_bytes)
        self.committer = DeltaSinkCommitter(self.target, max_attempts=max_attempts)
