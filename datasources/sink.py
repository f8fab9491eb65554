"""``ckpt-sink``: a stream writer with two-phase commit into a Delta table.

``df.writeStream.format("ckpt-sink").option("pipeline", ...).option("path", ...)`` where *df*
still carries the barrier columns of ``ckpt-source`` (select them along with your columns).
Data rows before barrier *n* become visible in the table only when checkpoint *n* completed:

* ``write`` (executors): each run of data rows between barriers of a channel is staged as a
  Parquet file under the table root (invisible to readers); the commit message lists the
  staged files and the barriers, per channel, in order;
* ``commit`` (a fresh driver-side process every micro-batch): folds them into the sink's
  ledger (:mod:`spark_ckpt.sinks.ledger`); when every channel delivered barrier *n*, writes the
  transaction into the checkpoint store and acknowledges *n* to the coordinator (mailbox);
* the coordinator commits the transaction into the table when *n* completes, in one Delta
  commit with an app transaction (``txn`` appId/version): a replay is a no-op. On restart,
  transactions of a completed but uncommitted checkpoint are committed, others discarded.

The output table holds the user columns only.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from spark_ckpt.errors import ConfigError, ProtocolError
from spark_ckpt.protocol.barrier import BARRIER_COLUMNS
from spark_ckpt.protocol.checkpoint import task_state_uid
from spark_ckpt.protocol.handle import (
    AcknowledgeCheckpoint,
    BlobKind,
    SourceOffset,
    StateBlob,
    TaskId,
    TaskSnapshot,
)
from spark_ckpt.runtime.carried_transactions import SINK_TRANSACTIONS, sealed_table
from spark_ckpt.sinks.ledger import SinkEvent, SinkLedger, split_at_barriers
from spark_ckpt.sinks.sink import (
    CommitProgress,
    SinkCommitter,
    Transaction,
)
from spark_ckpt.spark.mailbox import Mailbox, SinkSpec, Topology, read_topology, write_topology
from spark_ckpt.spark.source_options import SOURCE_TASK, default_root
from spark_ckpt.storage.store import StateStorage

if TYPE_CHECKING:
    from spark_ckpt.delta.sink_writer import DeltaSinkWriter

FORMAT = "ckpt-sink"
_KEYS = frozenset({"pipeline", "path", "store", "uid", "checkpointlocation"})


def _absolute(path: str) -> str:
    return path if "://" in path else os.path.abspath(path)


@dataclass(frozen=True)
class SinkOptions:
    pipeline: str
    path: str
    root: str
    uid: str
    run: str  # identifies the query run (its Spark checkpoint location)

    @staticmethod
    def parse(options: dict[str, str]) -> SinkOptions:
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        for key in opts:
            if key not in _KEYS:
                raise ConfigError(key, opts[key], f"a ckpt-sink option: {sorted(_KEYS)}")
        pipeline = opts.get("pipeline", "")
        if not pipeline:
            raise ConfigError("pipeline", None, "the pipeline name (as given to ckpt-source)")
        path = opts.get("path", "")
        if not path:
            raise ConfigError("path", None, "the output Delta table's path")
        root = opts.get("store") or default_root(pipeline)
        run = hashlib.sha256(opts.get("checkpointlocation", "").encode()).hexdigest()[:16]
        return SinkOptions(pipeline, _absolute(path), _absolute(root), opts.get("uid", FORMAT), run)

    @property
    def spec(self) -> SinkSpec:
        return SinkSpec(FORMAT, self.path, self.uid)

    @property
    def task(self) -> TaskId:
        return TaskId(self.uid, 0)


@dataclass
class SinkMessage(WriterCommitMessage):  # type: ignore[misc]
    events: tuple[str, ...]  # SinkEvent JSON


class CkptSinkWriter(DataSourceStreamArrowWriter):  # type: ignore[misc]
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def _writer(self) -> DeltaSinkWriter:
        """The sink's writer, on an executor: stages files, never touches the Delta log."""
        from spark_ckpt.delta.sink_target import DeltaSinkTarget
        from spark_ckpt.delta.sink_writer import DeltaSinkWriter

        target = DeltaSinkTarget(self.options.path, pipeline=self.options.pipeline)
        return DeltaSinkWriter(target)

    def _progress(self) -> CommitProgress:
        """What the sink's committer (the coordinator) has committed, read on the driver."""
        return sink_from_spec(self.options.spec, pipeline=self.options.pipeline)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkMessage:
        """Executor: stage the partition's runs of data rows, report files and barriers."""
        batches = list(iterator)
        if not batches:
            return SinkMessage(())
        table = pa.Table.from_batches(batches)
        missing = [c for c in BARRIER_COLUMNS if c not in table.column_names]
        if missing:
            raise ProtocolError(
                f"ckpt-sink needs the barrier columns of ckpt-source; missing {missing}"
            )
        writer = self._writer()
        events = split_at_barriers(table, lambda rows: writer.stage(rows, subtask=0).to_json())
        return SinkMessage(tuple(json.dumps(e.to_dict()) for e in events))

    def _ledger_path(self) -> str:
        return os.path.join(
            self.options.root, "_sink", self.options.uid, f"{self.options.run}.json"
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver, fresh process per batch: fold the batch in; acknowledge ready checkpoints."""
        from spark_ckpt.delta.store import DeltaCheckpointStore

        path = self._ledger_path()
        ledger = SinkLedger()
        if os.path.exists(path):
            with open(path) as f:
                ledger = SinkLedger.from_json(f.read())
        events = [
            SinkEvent.from_dict(json.loads(e))
            for m in messages
            if isinstance(m, SinkMessage)
            for e in m.events
        ]
        ready = ledger.apply(batchId, events)
        ledger.committed(self._progress().committed_checkpoint())
        if ready:
            store: StateStorage = DeltaCheckpointStore(self.options.root)
            mailbox = Mailbox(self.options.root)
            task = self.options.task
            for cid in ready:
                txns = tuple(
                    Transaction(self.options.uid, 0, c, tuple(files)).to_json()
                    for c, files in ledger.pending_transactions(cid).items()
                )
                blob = StateBlob(
                    task_state_uid(self.options.uid),
                    0,
                    BlobKind.OPERATOR,
                    SINK_TRANSACTIONS,
                    sealed_table(txns),
                )
                offsets = tuple(
                    SourceOffset(SOURCE_TASK.vertex, ch, off)
                    for ch, off in sorted(ledger.arrivals[cid].items())
                )
                handle = store.write_task_state(cid, TaskSnapshot(task, (blob,), (), offsets))
                mailbox.post(AcknowledgeCheckpoint(cid, task, handle, sealed=txns))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(ledger.to_json())
        os.replace(tmp, path)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The batch failed: its staged files are never referenced; recovery deletes them."""


class CkptSink(DataSource):  # type: ignore[misc]
    """``writeStream.format("ckpt-sink")``; options ``pipeline``, ``path``, ``store``, ``uid``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = SinkOptions.parse(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> CkptSinkWriter:
        o = self.parsed
        topology = Topology(o.uid, 1, o.spec, o.run)
        if read_topology(o.root) != topology:
            write_topology(o.root, topology)
        return CkptSinkWriter(o)


def sink_from_spec(spec: SinkSpec, *, pipeline: str) -> SinkCommitter:
    """The committer of a topology's :class:`SinkSpec`, for the coordinator (the global
    committer, driver side): a :class:`~spark_ckpt.delta.sink_committer.DeltaSinkCommitter`
    for kind ``delta`` (the foreachBatch aligner's output) and ``ckpt-sink``."""
    if spec.kind not in ("delta", FORMAT):
        raise ConfigError("sink", spec.kind, f"delta or {FORMAT}")
    from spark_ckpt.delta.sink_committer import DeltaSinkCommitter
    from spark_ckpt.delta.sink_target import DeltaSinkTarget

    target = DeltaSinkTarget(spec.path, pipeline=pipeline, storage_options=spec.options or None)
    return DeltaSinkCommitter(target)
