"""The sink vertex's global committer, on the coordinator's host (Flink's ``GlobalCommitter``):
it recovers the sink (and the late-output table, when the pipeline has one) when a
coordinator starts, commits every completed checkpoint's sink transactions in one step per
table, tells the run's subtasks which checkpoint is committed, and exports
completed savepoints into their directories.

It runs on the host's thread, after the coordinator recorded a completion (see
:mod:`spark_ckpt.sinks.two_phase_commit` for the protocol that makes the output
exactly-once). Every step is idempotent: a completion may be handed to it again after a
restart, and a commit it already made is a no-op.
"""

from __future__ import annotations

import logging

from spark_ckpt.coordination.runs import RunFiles
from spark_ckpt.coordination.topology import SinkSpec
from spark_ckpt.delta.savepoint import export_savepoint, savepoint_directory
from spark_ckpt.errors import ConfigError, StoreError
from spark_ckpt.locations.credentials import NO_STORAGE_OPTIONS, StorageOptions
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.protocol.state_handles import AcknowledgeCheckpoint
from spark_ckpt.runtime.carried_transactions import CarriedTransactions
from spark_ckpt.runtime.restore_settings import PIPELINE
from spark_ckpt.runtime.task import commit_checkpoint, recover_sink
from spark_ckpt.sinks.two_phase_commit import SinkCommitter
from spark_ckpt.storage.checkpoint_store import CheckpointStore

log = logging.getLogger(__name__)

#: The sink kinds a topology names: the pipeline's output table, and a ``ckpt-sink`` query's.
SINK_KINDS = ("delta", "ckpt-sink")

#: Recovery discards staged output of earlier runs only: files staged before the host started,
#: less this margin for clock skew between executors and the driver. Files of the starting run
#: (a ``ckpt-sink`` query stages its first micro-batch before the coordinator hears of it) stay.
STAGING_CLOCK_SKEW_MS = 10_000


def sink_from_spec(
    spec: SinkSpec, *, pipeline: str, storage: StorageOptions = NO_STORAGE_OPTIONS
) -> SinkCommitter:
    """The committer of a topology's :class:`~spark_ckpt.coordination.topology.SinkSpec`: a
    :class:`~spark_ckpt.delta.sink_committer.DeltaSinkCommitter` for kind ``delta`` (the
    pipeline's output) and ``ckpt-sink``. Cheap: nothing is read until it commits. The
    pipeline's explicit *storage* options, if any, cover the sink's table too (installed
    here)."""
    if spec.kind not in SINK_KINDS:
        raise ConfigError("sink", spec.kind, " or ".join(SINK_KINDS))
    if storage:
        storage.covering(spec.path).install()
    from spark_ckpt.delta.sink_committer import DeltaSinkCommitter
    from spark_ckpt.delta.sink_target import DeltaSinkTarget

    target = DeltaSinkTarget(spec.path, pipeline=pipeline, storage_options=spec.options or None)
    return DeltaSinkCommitter(target)


class GlobalCommitter:
    """Commits the sink of the host's topology (set by :meth:`install`; ``None``: no sink,
    every step is a no-op but the savepoint export) for the checkpoints of *store* under
    *root*.
    *run*: the run's files, where the committed checkpoint is published for its subtasks
    (``None`` for a ``ckpt-sink`` query). *pipeline* and *max_parallelism* are recorded on
    exported savepoints; *staged_before_ms* bounds what recovery discards. Single-threaded."""

    def __init__(
        self,
        root: str,
        store: CheckpointStore,
        *,
        run: RunFiles | None,
        pipeline: str,
        max_parallelism: int,
        staged_before_ms: int,
    ) -> None:
        self.root = root
        self.store = store
        self.sink: SinkCommitter | None = None
        #: the table of the rows dropped as late (None: the pipeline names none)
        self.late: SinkCommitter | None = None
        #: the tables of the operators' named outputs (side outputs)
        self.sides: dict[str, SinkCommitter] = {}
        self.run = run
        self.pipeline = pipeline
        self.max_parallelism = max_parallelism
        self.staged_before_ms = staged_before_ms
        self._committed: set[int] = set()
        #: the sink transactions the acknowledgements carried, for the sink commits
        self._carried = CarriedTransactions()

    def install(
        self,
        sink: SinkCommitter | None,
        restored: CompletedCheckpoint | None,
        *,
        late: SinkCommitter | None = None,
        sides: dict[str, SinkCommitter] | None = None,
    ) -> None:
        """A coordinator starts with *sink* (its topology's; ``None``: none) and *late* (the
        late-output table's): roll each back to *restored* and commit its transactions
        (Flink's recover-and-commit; see :func:`~spark_ckpt.runtime.task.recover_sink`),
        and each of *sides* (the named outputs' tables) likewise, then publish it as
        committed. Idempotent."""
        self.sink = sink
        self.late = late
        self.sides = dict(sides or {})
        if sink is None:
            return
        recover_sink(sink, restored, self.store, staged_before_ms=self.staged_before_ms)
        for extra in [late, *self.sides.values()]:
            if extra is not None:
                recover_sink(
                    extra,
                    restored,
                    self.store,
                    staged_before_ms=self.staged_before_ms,
                    legacy=False,
                )
        if restored is not None:
            self._committed.add(restored.checkpoint_id)
            self._publish(restored.checkpoint_id)

    def record(self, ack: AcknowledgeCheckpoint) -> None:
        """Keep the sink transactions *ack* carries for its checkpoint's commit (no read of
        the store then). Call only for a pending checkpoint: late ones would linger."""
        self._carried.record(ack)

    def complete(self, checkpoint_id: int) -> CompletedCheckpoint | None:
        """Checkpoint *checkpoint_id* completed: commit its sink transactions, publish it,
        and export it when it is a savepoint. Returns the checkpoint, or ``None`` when it
        was handled before (idempotent). Costs one read of the checkpoint and the sink's
        commit (one Delta commit)."""
        if checkpoint_id in self._committed:
            return None
        self._committed.add(checkpoint_id)
        cp = self.store.get(checkpoint_id)
        if self.sink is not None:
            commit_checkpoint(self.sink, cp, self.store, self._carried)
        if self.late is not None:
            commit_checkpoint(self.late, cp, self.store, self._carried, legacy=False)
        for side in self.sides.values():
            commit_checkpoint(side, cp, self.store, self._carried, legacy=False)
        self._carried.forget_upto(checkpoint_id)
        self._publish(checkpoint_id)
        if cp.is_savepoint:
            self._export(cp)
        return cp

    def aborted(self, checkpoint_id: int) -> None:
        """Checkpoint *checkpoint_id* was aborted: its carried transactions are dropped."""
        self._carried.forget(checkpoint_id)

    def _publish(self, checkpoint_id: int) -> None:
        """Tell the run's subtasks on the executors that *checkpoint_id* completed and its
        output is committed (``committed.json``, read before each of their micro-batches:
        its snapshot becomes the base of their next incremental one). A record that cannot
        be written is logged: the subtasks then keep their older base, which is safe."""
        if self.run is None:
            return
        try:
            self.run.write_committed(checkpoint_id)
        except StoreError as e:
            log.warning("cannot record the completion of checkpoint %d: %s", checkpoint_id, e)

    def _export(self, savepoint: CompletedCheckpoint) -> None:
        """Write the self-contained copy of a completed savepoint into its directory (after
        its sink commit: the copy is what a stop-with-savepoint leaves behind). A failure is
        logged; whoever waits for the copy reports it."""
        directory = savepoint_directory(self.root, savepoint)
        try:
            export_savepoint(
                self.store,
                savepoint,
                directory,
                pipeline=savepoint.properties.get(PIPELINE, self.pipeline),
                max_parallelism=self.max_parallelism,
                root=self.root,
            )
        except StoreError as e:
            log.error(
                "savepoint %d could not be exported to %s: %s",
                savepoint.checkpoint_id,
                directory,
                e,
            )
