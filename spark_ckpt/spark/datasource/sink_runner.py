"""The work of ``ckpt-sink``, a stream writer with two-phase commit into a Delta table
(:mod:`datasources.ckpt_sink` holds its hooks).

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs

from spark_ckpt.coordination.global_committer import sink_from_spec
from spark_ckpt.coordination.mailbox import Mailbox
from spark_ckpt.coordination.topology import SinkSpec, Topology, read_topology, write_topology
from spark_ckpt.errors import ConfigError, ProtocolError
from spark_ckpt.locations.credentials import NO_STORAGE_OPTIONS, StorageOptions
from spark_ckpt.locations.credentials import OPTION as STORAGE_OPTION
from spark_ckpt.locations.objects import read_json, write_whole
from spark_ckpt.locations.uris import filesystem, normalized, store_errors
from spark_ckpt.protocol.barrier import BARRIER_COLUMNS
from spark_ckpt.protocol.checkpoint import task_state_uid
from spark_ckpt.protocol.state_handles import (
    AcknowledgeCheckpoint,
    BlobKind,
    SourceOffset,
    StateBlob,
    TaskId,
    TaskSnapshot,
)
from spark_ckpt.runtime.carried_transactions import SINK_TRANSACTIONS, sealed_table
from spark_ckpt.runtime.task import SOURCE_TASK
from spark_ckpt.sinks.ledger import SinkEvent, SinkLedger, split_at_barriers
from spark_ckpt.sinks.two_phase_commit import CommitProgress, Transaction
from spark_ckpt.spark.datasource.formats import SINK_FORMAT
from spark_ckpt.spark.datasource.source_options import default_root
from spark_ckpt.storage.checkpoint_store import StateStorage

if TYPE_CHECKING:
    from spark_ckpt.delta.sink_writer import DeltaSinkWriter

_KEYS = frozenset({"pipeline", "path", "store", "uid", "checkpointlocation", STORAGE_OPTION})


def _absolute(path: str) -> str:
    return normalized(path)


@dataclass(frozen=True)
class SinkOptions:
    """The options of ``ckpt-sink``, parsed and validated (a planner worker at ``load()``)."""

    pipeline: str
    path: str
    root: str
    uid: str
    run: str  # identifies the query run (its Spark checkpoint location)
    #: the pipeline's explicit storage options (``storage.secret``: see
    #: :meth:`Pipeline.sink_options <spark_ckpt.pipeline.pipeline.Pipeline.sink_options>`)
    storage: StorageOptions = NO_STORAGE_OPTIONS

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
        storage = NO_STORAGE_OPTIONS
        if STORAGE_OPTION in opts:
            storage = StorageOptions.from_json(opts[STORAGE_OPTION]).covering(path, root)
        return SinkOptions(
            pipeline, _absolute(path), _absolute(root), opts.get("uid", SINK_FORMAT), run, storage
        )

    @property
    def spec(self) -> SinkSpec:
        return SinkSpec(SINK_FORMAT, self.path, self.uid)

    @property
    def task(self) -> TaskId:
        return TaskId(self.uid, 0)

    def install_topology(self) -> None:
        """The query's coordinator learns who acknowledges and what it commits: publish the
        root's shared topology unless it is this one already (driver, ``streamWriter``)."""
        topology = Topology(self.uid, 1, self.spec, self.run)
        if read_topology(self.root) != topology:
            write_topology(self.root, topology)


class SinkRunner:
    """The work of ``ckpt-sink``'s stream writer for the sink *options*: staging on the
    executors, the ledger and acknowledgements in the driver's commit process."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        options.storage.install()  # wherever the runner is built (driver, executor)

    def _writer(self) -> DeltaSinkWriter:
        """The sink's writer, on an executor: stages files, never touches the Delta log."""
        from spark_ckpt.delta.sink_target import DeltaSinkTarget
        from spark_ckpt.delta.sink_writer import DeltaSinkWriter

        target = DeltaSinkTarget(self.options.path, pipeline=self.options.pipeline)
        return DeltaSinkWriter(target)

    def _progress(self) -> CommitProgress:
        """What the sink's committer (the coordinator) has committed, read on the driver."""
        return sink_from_spec(self.options.spec, pipeline=self.options.pipeline)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> tuple[str, ...]:
        """Executor: stage the partition's runs of data rows; returns its events (files
        and barriers, per channel, in order) as JSON."""
        self.options.storage.install()  # an executor's worker
        batches = list(iterator)
        if not batches:
            return ()
        table = pa.Table.from_batches(batches)
        missing = [c for c in BARRIER_COLUMNS if c not in table.column_names]
        if missing:
            raise ProtocolError(
                f"ckpt-sink needs the barrier columns of ckpt-source; missing {missing}"
            )
        writer = self._writer()
        events = split_at_barriers(table, lambda rows: writer.stage(rows, subtask=0).to_json())
        return tuple(json.dumps(e.to_dict()) for e in events)

    def _ledger(self) -> tuple[pafs.FileSystem, str, SinkLedger]:
        """The file system of the store, the path of this run's ledger in it, and the ledger
        (empty before the first commit)."""
        fs, root = filesystem(self.options.root)
        path = f"{root}/_sink/{self.options.uid}/{self.options.run}.json"
        with store_errors(self.options.root, "read the sink's ledger under"):
            try:
                return fs, path, SinkLedger.from_dict(read_json(fs, path))
            except FileNotFoundError:
                return fs, path, SinkLedger()

    def commit(self, messages: Sequence[Sequence[str]], batch_id: int) -> None:
        """Driver, fresh process per batch: fold the batch's events (*messages*: each
        partition's, from :meth:`write`) into the ledger; acknowledge ready checkpoints.
        Idempotent for a replayed batch (same id)."""
        from spark_ckpt.delta.delta_store import DeltaCheckpointStore

        self.options.storage.install()  # the commit's fresh process
        fs, path, ledger = self._ledger()
        events = [SinkEvent.from_dict(json.loads(e)) for m in messages for e in m]
        ready = ledger.apply(batch_id, events)
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
        write_whole(fs, path, ledger.to_json().encode())
