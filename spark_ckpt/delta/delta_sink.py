"""Exactly-once output into a Delta table: a two-phase-commit sink on delta-rs (``deltalake``).

The design follows Flink's ``TwoPhaseCommitSinkFunction`` (and Arroyo's Delta sink):

1. **Stage** (task side, executors or driver; never loads the Delta table). Output rows are
   encoded as they arrive into an in-progress Parquet file per (operator, subtask) (zstd,
   timestamps as UTC microseconds, barrier columns dropped; one row group per write), like
   the part files of Flink's file sink, directly under the table root, named
   ``part-<subtask>-<uuid4>-ckpt-<sink tag>.c000.zstd.parquet``. The name is unique and never
   reused; the tag is a hash of the sink's app id, so a sink only ever cleans up its own
   files. A staged file is described by a
   :class:`~spark_ckpt.delta.staged_file.StagedFile` (path relative to the table root,
   size, rows, Delta statistics JSON). Staged files are invisible to Delta readers: nothing
   in the log references them. This is the writer's job
   (:class:`~spark_ckpt.delta.sink_writer.DeltaSinkWriter`).
2. **Pre-commit** (synchronous phase of checkpoint *n*) closes the in-progress file (writes
   its footer) and seals the subtask's staged files into a
   :class:`~spark_ckpt.sinks.two_phase_commit.Transaction` whose payload is the tuple of
   :meth:`StagedFile.to_json` strings (an empty transaction is fine). The writer's job too.
3. **Commit** adds the files to the Delta log — the committer's job
   (:class:`~spark_ckpt.delta.sink_committer.DeltaSinkCommitter`, in the global
   committer, driver side), as are steps 4 and 5. ``commit_checkpoint`` makes
   every file of all transactions of checkpoint *n* visible in **one** Delta commit that also
   records the app transaction ``spark-ckpt/<pipeline>`` at version *n*: the identity of
   the output belongs to the pipeline and the table, not to the operator chain, so every
   version of the job that writes the table commits under it.
   ``commit`` (one transaction) adds one transaction's files and leaves the version where
   it is.
4. **Abort / recover** delete staged files that never became part of the table.
5. **Roll back** (at a restore, before recover) removes from the table this sink's output of
   checkpoints after the restored one, which the job replays.

Invariants and why they give exactly-once output:

* **Files are added at most once.** Every commit re-reads the table, drops the files already
  in it, and commits on exactly that snapshot with ``max_commit_retries=0``: delta-rs writes
  the next log file with put-if-absent, so the commit lands at the next version or raises
  ``CommitFailedError``; the loser re-reads, finds the files and does nothing. (Rebasing is
  deliberately off. With delta-rs' default retries an append carrying the same app id as a
  concurrent winner does fail — ``Concurrent transaction failed`` — but two racing
  ``create_table_with_add_actions`` calls were observed to *both* succeed: the loser's
  CREATE TABLE with its add actions was rebased to version 1, duplicating the data.)
  Every commit also carries the sink's app transaction, so delta-rs' own conflict check
  agrees.
* **The app version means "every transaction sealed at a checkpoint <= version is in the
  table".** ``commit_checkpoint`` for *n* is a no-op once the version is >= *n* (delta-rs
  itself would accept a *lower* version — verified — so the check is ours; it is race free
  because commits are never rebased). This is sound because the state of checkpoint *n'*
  records every sealed, uncommitted transaction <= *n'* of every subtask
  (``OperatorTask._complete`` in :mod:`spark_ckpt.runtime.task`): if *n'* > *n* was committed
  first, it contained the transactions of *n*. Consequently ``commit_checkpoint`` must be
  given **all** transactions of the checkpoint in one call, and a pipeline writes a table
  through one sink vertex.
* **The app version is monotone except for a roll back at restore.** A job that restores
  checkpoint *r* replays its input from *r*'s source positions, so the table must then hold
  exactly the output of checkpoints <= *r* — also when it already holds output of later ones
  (the newest checkpoint was damaged and the restore fell back, or an older one was restored
  on purpose). ``roll_back_to`` *r* finds, in the log's JSON commits, the table version at
  which the sink's output was that of *r* (:mod:`spark_ckpt.delta.rollback_plan`) and, in
  one commit that sets the version to *r*, removes every file of the sink added since that
  the version does not hold, and adds back those of its files a later roll back removed (a
  restore of a checkpoint that an earlier restore left behind). A commit after it may also
  have carried transactions of checkpoints <= *r* (whose own commit was lost in a crash);
  ``recover``, which follows with *r*'s transactions, adds their files again whatever the
  version, which restores the invariant above. Checkpoint ids are never reused, so later
  checkpoints (> the damaged one > *r*) commit normally. Output of this sink that another
  writer rewrote (OPTIMIZE) cannot be rolled back.
* **Nothing referenced is deleted.** A roll back only removes files from the table; ``abort``
  and the orphan sweep of ``recover`` delete only files that no version of the table the log
  describes references (current files and Delta's tombstones): every version keeps reading
  until a ``VACUUM``. ``recover`` must not run concurrently with writers of the same sink (it
  would delete their in-flight staged files): run it once per job (re)start, before any task
  writes.

The table is created by the first commit that has files, from their schema (all columns
nullable), with protocol reader 1 / writer 2: no deletion vectors, no column mapping, UTC
``timestamp`` columns — readable by Spark's Delta Lake, polars and DuckDB. The table is not
partitioned (staging would have to write Hive-style partition directories and partition
values).

Errors of delta-rs, Arrow and the file system are translated into
:class:`~spark_ckpt.errors.StoreError`; staged data that does not fit the table raises
:class:`~spark_ckpt.errors.ProtocolError` naming the columns.

The modules: :mod:`~spark_ckpt.delta.sink_target` (the table, its file system, the app id
and file tag, shared by both roles), :mod:`~spark_ckpt.delta.output_schema` (type coercion,
schema checks), :mod:`~spark_ckpt.delta.stats` (Delta file statistics),
:mod:`~spark_ckpt.delta.part_file` (the in-progress Parquet file and its name),
:mod:`~spark_ckpt.delta.staged_file` (a sealed file as the log records it),
:mod:`~spark_ckpt.delta.sink_writer` and :mod:`~spark_ckpt.delta.sink_committer` (the two
roles), and here :class:`DeltaSink`, which pairs them for one process.
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
