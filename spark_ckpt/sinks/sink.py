"""Two-phase-commit sinks (Flink's ``TwoPhaseCommitSinkFunction``).

Output written between two barriers goes into one *transaction*, staged where the sink keeps
data (files, a staging table) but invisible to readers:

1. ``write`` stages output into the subtask's open transaction (task side);
2. ``pre_commit`` (at the synchronous snapshot of checkpoint *n*) seals it into a
   :class:`Transaction`, whose handle the task stores in its checkpointed state;
3. ``commit_checkpoint`` makes every transaction recorded in completed checkpoint *n* visible
   at once — run by one *global committer* (the process hosting the coordinator) after the
   completion commit. It must be idempotent: it may run again after a crash (recover-and-commit
   from restored state), and a transaction may be included again by a later checkpoint;
4. ``abort`` discards a sealed transaction whose checkpoint failed, and ``recover`` (on
   restart) commits the transactions of the restored checkpoint and discards every other
   staged transaction — which never became part of a completed checkpoint;
5. ``roll_back_to`` (on restart, before ``recover``) withdraws committed output of
   checkpoints after the restored one, which the job is about to replay: a restore that
   fell back past a damaged newest checkpoint, or restored an older one on purpose, must
   leave exactly the output of checkpoints <= the restored one.

A task keeps a sealed transaction in its checkpointed state until the sink reports it committed
(:meth:`committed_checkpoint`), not merely until it hears that the checkpoint completed: a crash
between completion and commit then still finds the transaction in the next checkpoint.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from spark_ckpt.errors import ProtocolError


@dataclass(frozen=True)
class Transaction:
    """A sealed transaction: output of subtask *subtask* of *operator_uid* before barrier
    *checkpoint_id*. ``payload`` is sink-specific (e.g. staged file paths), JSON-encodable."""

    operator_uid: str
    subtask: int
    checkpoint_id: int
    payload: tuple[str, ...] = ()

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
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"not a sink transaction: {text!r}") from e


#: Arrow schema under which tasks keep their sealed, not yet committed transactions.
TRANSACTION_STATE_SCHEMA = pa.schema([pa.field("transaction", pa.string(), nullable=False)])


class TwoPhaseCommitSink(Protocol):
    def write(self, operator_uid: str, subtask: int, table: pa.Table) -> None: ...

    def pre_commit(self, operator_uid: str, subtask: int, checkpoint_id: int) -> Transaction: ...

    def commit(self, txn: Transaction) -> None: ...

    def commit_checkpoint(self, checkpoint_id: int, txns: Sequence[Transaction]) -> bool:
        """Commit *txns* (everything recorded in checkpoint *checkpoint_id*) at once; returns
        False when it was already committed."""
        ...

    def committed_checkpoint(self) -> int:
        """The highest checkpoint id whose transactions are committed (0 if none)."""
        ...

    def abort(self, txn: Transaction) -> None: ...

    def recover(
        self,
        operator_uid: str,
        to_commit: Sequence[Transaction],
        *,
        staged_before_ms: int | None = None,
    ) -> None:
        """Commit every transaction of *to_commit* not yet committed — even when the committed
        checkpoint is already >= theirs (a preceding :meth:`roll_back_to` may have withdrawn
        them) — and discard other staged data of *operator_uid* (only data staged before
        *staged_before_ms*, when given)."""
        ...

    def roll_back_to(self, checkpoint_id: int) -> list[str]:
        """At a restore from *checkpoint_id*, before :meth:`recover`: if the committed
        checkpoint is above *checkpoint_id*, withdraw in one atomic step the output that
        commits at later checkpoints made visible (possibly including transactions of
        checkpoints <= *checkpoint_id* that a later checkpoint committed: :meth:`recover`
        with the restored checkpoint's transactions commits them again) and make the
        committed checkpoint *checkpoint_id*. Output of other writers is never withdrawn.
        Returns identifiers of what was withdrawn (sink-specific: file paths, transaction
        ids). Idempotent; a no-op returning ``[]`` when nothing later was committed."""
        ...


class MemorySink:
    """A 2PC sink in memory, for simulations and tests. Its staged and committed areas play the
    role of external storage: they survive a simulated crash of the job."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[tuple[str, int], list[pa.Table]] = {}
        self._staged: dict[str, list[pa.Table]] = {}
        self.committed: dict[str, list[pa.Table]] = {}
        self.commit_calls = 0
        self._committed_checkpoint = 0
        self._committed_at: dict[str, int] = {}  # txn id -> the checkpoint that committed it

    def write(self, operator_uid: str, subtask: int, table: pa.Table) -> None:
        with self._lock:
            self._open.setdefault((operator_uid, subtask), []).append(table)

    def pre_commit(self, operator_uid: str, subtask: int, checkpoint_id: int) -> Transaction:
        txn = Transaction(operator_uid, subtask, checkpoint_id)
        with self._lock:
            self._staged[txn.txn_id] = self._open.pop((operator_uid, subtask), [])
        return txn

    def commit(self, txn: Transaction) -> None:
        with self._lock:
            self.commit_calls += 1
            if txn.txn_id in self.committed:
                return
            staged = self._staged.pop(txn.txn_id, None)
            if staged is None:
                raise ProtocolError(f"transaction {txn.txn_id} was never staged")
            self.committed[txn.txn_id] = staged
            self._committed_at[txn.txn_id] = max(txn.checkpoint_id, self._committed_checkpoint)

    def commit_checkpoint(self, checkpoint_id: int, txns: Sequence[Transaction]) -> bool:
        if checkpoint_id <= self._committed_checkpoint:
            return False
        self._committed_checkpoint = checkpoint_id
        for txn in txns:
            self.commit(txn)
        return True

    def roll_back_to(self, checkpoint_id: int) -> list[str]:
        """Withdraw every committed transaction that a commit at a checkpoint >
        *checkpoint_id* made visible (they become staged again, as a Delta sink's removed
        files stay on disk until the orphan sweep) and set the committed checkpoint to
        *checkpoint_id*; returns the withdrawn transaction ids (sorted). A no-op returning
        ``[]`` when the committed checkpoint is <= *checkpoint_id*."""
        with self._lock:
            if self._committed_checkpoint <= checkpoint_id:
                return []
            gone = sorted(t for t, c in self._committed_at.items() if c > checkpoint_id)
            for tid in gone:
                self._staged[tid] = self.committed.pop(tid)  # staged again, as files stay
                del self._committed_at[tid]
            self._committed_checkpoint = checkpoint_id
            return gone

    def committed_checkpoint(self) -> int:
        return self._committed_checkpoint

    def abort(self, txn: Transaction) -> None:
        with self._lock:
            self._staged.pop(txn.txn_id, None)

    def recover(
        self,
        operator_uid: str,
        to_commit: Sequence[Transaction],
        *,
        staged_before_ms: int | None = None,
    ) -> None:
        """Commit every transaction of *to_commit* not yet committed — whatever the committed
        checkpoint, like :meth:`DeltaSink.recover <spark_ckpt.delta.sink.DeltaSink.recover>`:
        after :meth:`roll_back_to` it may already be the restored one while transactions of
        it were withdrawn — raising the committed checkpoint to their largest id; then drop
        the other staged transactions of *operator_uid*. (Staging is in memory and
        synchronous here: *staged_before_ms* has no effect.)"""
        if to_commit:
            target = max(t.checkpoint_id for t in to_commit)
            self._committed_checkpoint = max(self._committed_checkpoint, target)
            for txn in to_commit:
                self.commit(txn)
        with self._lock:
            for tid in [t for t in self._staged if t.startswith(operator_uid + "/")]:
                del self._staged[tid]

    def crash(self) -> None:
        """Lose what was only in task memory (open transactions); staged data survives."""
        with self._lock:
            self._open.clear()

    def output(self) -> pa.Table | None:
        tables: Iterable[pa.Table] = (t for ts in self.committed.values() for t in ts)
        tables = [t for t in tables if t.num_rows]
        return pa.concat_tables(tables) if tables else None
