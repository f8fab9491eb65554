"""The two-phase-commit sink contract (Flink's ``TwoPhaseCommittingSink``: a ``SinkWriter``
and a ``Committer``).

Output written between two barriers goes into one *transaction*, staged where the sink keeps
data (files, a staging table) but invisible to readers. The work is split between two roles
that may live in different processes and only share the external storage and the sealed
:class:`Transaction` handles (JSON, kept in the tasks' checkpointed state):

* the :class:`SinkWriter` runs where the tasks run — an executor (``ckpt-sink``'s
  ``write``), the foreachBatch process (the foreachBatch aligner's tasks), a simulated
  scheduler in tests:

  1. ``write`` stages output into the subtask's open transaction;
  2. ``pre_commit`` (at the synchronous snapshot of checkpoint *n*) seals it into a
     :class:`Transaction`, whose handle the task stores in its checkpointed state;

* the :class:`SinkCommitter` runs in one *global committer* per sink vertex — the process
  hosting the coordinator (the driver), or a job of its own in simulations:

  3. ``commit_checkpoint`` makes every transaction recorded in completed checkpoint *n*
     visible at once, after the completion commit. It must be idempotent: it may run again
     after a crash (recover-and-commit from restored state), and a transaction may be
     included again by a later checkpoint;
  4. ``abort`` discards a sealed transaction whose checkpoint failed, and ``recover`` (on
     restart) commits the transactions of the restored checkpoint and discards every other
     staged transaction — which never became part of a completed checkpoint;
  5. ``roll_back_to`` (on restart, before ``recover``) withdraws committed output of
     checkpoints after the restored one, which the job is about to replay: a restore that
     fell back past a damaged newest checkpoint, or restored an older one on purpose, must
     leave exactly the output of checkpoints <= the restored one.

A task keeps a sealed transaction in its checkpointed state until the sink reports it
committed (:meth:`CommitProgress.committed_checkpoint`), not merely until it hears that the
checkpoint completed: a crash between completion and commit then still finds the transaction
in the next checkpoint. That is the only thing a task reads of the committer; a
:class:`TransactionalSink` pairs the two roles for the tasks of one sink vertex.

A restarted job uses fresh writers: what an old writer had open (not sealed) was never part
of a checkpoint, and the committer's ``recover`` discards what it staged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from spark_ckpt.errors import ProtocolError


@dataclass(frozen=True)
class Transaction:
    """A sealed transaction: output of subtask *subtask* of *operator_uid* before barrier
    *checkpoint_id*. ``payload`` is sink-specific (e.g. staged file paths), JSON-encodable.
    ``sink`` is the identity of the storage it was staged for
    (:attr:`SinkCommitter.sink_id`: a Delta sink's table URI); empty in transactions
    sealed by versions before 0.2, which did not record it."""

    operator_uid: str
    subtask: int
    checkpoint_id: int
    payload: tuple[str, ...] = ()
    sink: str = ""

    @property
    def txn_id(self) -> str:
        return f"{self.operator_uid}/{self.subtask}/{self.checkpoint_id}"

    def to_json(self) -> str:
        return json.dumps(
            {
                "operator_uid": self.operator_uid,
                "subtask": self.subtask,
                "checkpoint_id": self.checkpoint_id,
                "payload": list(self.payload),
                "sink": self.sink,
            },
            sort_keys=True,
        )

    @staticmethod
    def from_json(text: str) -> Transaction:
        try:
            d: dict[str, Any] = json.loads(text)
            return Transaction(
                str(d["operator_uid"]),
                int(d["subtask"]),
                int(d["checkpoint_id"]),
                tuple(str(p) for p in d.get("payload", ())),
                str(d.get("sink", "")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"not a sink transaction: {text!r}") from e


#: Arrow schema under which tasks keep their sealed, not yet committed transactions.
TRANSACTION_STATE_SCHEMA = pa.schema([pa.field("transaction", pa.string(), nullable=False)])


class SinkWriter(Protocol):
    """The writer role (Flink's ``SinkWriter``): stages a task's output and seals it at
    barriers. Runs where the tasks run (an executor, the foreachBatch process, a simulated
    scheduler); never makes output visible. Each (operator, subtask) is written by one
    thread at a time; an instance may serve several subtasks. Neither call is idempotent:
    every ``write`` adds output, every ``pre_commit`` seals (and empties) the open
    transaction."""

    def write(self, operator_uid: str, subtask: int, table: pa.Table) -> None:
        """Add *table* to the open transaction of (*operator_uid*, *subtask*)."""
        ...

    def pre_commit(self, operator_uid: str, subtask: int, checkpoint_id: int) -> Transaction:
        """Seal the open transaction of (*operator_uid*, *subtask*) as that of checkpoint
        *checkpoint_id* (possibly empty), recording the storage it was staged for in its
        ``sink``; the next ``write`` opens a new one."""
        ...


@runtime_checkable
class DetachableWriter(SinkWriter, Protocol):
    """A writer whose open transactions can move between processes: a subtask that runs
    one micro-batch per Spark task hands its open transaction over at the end of each and
    takes it back at the start of the next, wherever that runs."""

    def detach(self, operator_uid: str, subtask: int) -> tuple[str, ...]:
        """Close and hand over the open transaction of (*operator_uid*, *subtask*) as JSON
        strings; the writer forgets it."""
        ...

    def attach(self, operator_uid: str, subtask: int, staged: tuple[str, ...]) -> None:
        """Resume an open transaction that :meth:`detach` handed over."""
        ...


class CommitProgress(Protocol):
    """What the committer has committed: the one thing a task reads of it (to forget sealed
    transactions). Safe to call from any process that reaches the sink's storage."""

    def committed_checkpoint(self) -> int:
        """The highest checkpoint id whose transactions are committed (0 if none)."""
        ...


class SinkCommitter(CommitProgress, Protocol):
    """The committer role (Flink's ``Committer``): makes sealed transactions visible, after
    their checkpoint completed, and cleans up on restart. Runs in the sink vertex's global
    committer — the process hosting the coordinator (driver side) — one at a time per sink
    vertex (concurrent commits of the same checkpoint must stay safe). Every call is
    idempotent: a crash may repeat any of them."""

    @property
    def sink_id(self) -> str:
        """The identity of the storage this committer commits into (a Delta sink: the table
        URI). Transactions sealed for another storage are not its to commit."""
        ...

    def commit(self, txn: Transaction) -> None:
        """Make one transaction visible, leaving the committed checkpoint where it is.
        Idempotent."""
        ...

    def commit_checkpoint(self, checkpoint_id: int, txns: Sequence[Transaction]) -> bool:
        """Commit *txns* (everything recorded in checkpoint *checkpoint_id*) at once; returns
        False when it was already committed. Idempotent."""
        ...

    def abort(self, txn: Transaction) -> None:
        """Discard a sealed transaction whose checkpoint failed (never output that is
        already visible). Idempotent."""
        ...

    def recover(
        self, to_commit: Sequence[Transaction], *, staged_before_ms: int | None = None
    ) -> None:
        """Commit every transaction of *to_commit* not yet committed — even when the committed
        checkpoint is already >= theirs (a preceding :meth:`roll_back_to` may have withdrawn
        them) — and discard other staged data of this sink (only data staged before
        *staged_before_ms*, when given). Once per job (re)start, before the writers write.
        Idempotent."""
        ...

    def roll_back_to(self, checkpoint_id: int) -> list[str]:
        """At a restore from *checkpoint_id*, before :meth:`recover`: in one atomic step,
        make the sink hold the output it held as of *checkpoint_id* again — withdraw the
        output that commits at later checkpoints (or of a later lineage) made visible
        (possibly including transactions of checkpoints <= *checkpoint_id* that a later
        checkpoint committed: :meth:`recover` with the restored checkpoint's transactions
        commits them again), bring back what a roll back to an earlier checkpoint withdrew
        from *checkpoint_id*'s output where the sink can — and make the committed checkpoint
        *checkpoint_id*. This covers the output of every version of the
        job that wrote into the sink's storage for the same pipeline (the operator chain may
        have changed between them). Output of other writers is never withdrawn.
        Returns identifiers of what was withdrawn (sink-specific: file paths, transaction
        ids). Idempotent; a no-op returning ``[]`` when nothing later was committed."""
        ...


class TransactionalSink(Protocol):
    """A sink's writer and committer over the same storage, paired for the tasks of one
    sink vertex (Flink's ``TwoPhaseCommittingSink``): tasks write through :attr:`writer`
    and read :attr:`committer`'s progress; the global committer needs only a
    :class:`SinkCommitter`."""

    @property
    def writer(self) -> SinkWriter: ...

    @property
    def committer(self) -> SinkCommitter: ...
