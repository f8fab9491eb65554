"""A two-phase-commit sink in memory, for simulations and tests.

:class:`MemoryStaging` plays the role of external storage for sealed transactions, and the
:class:`MemorySinkCommitter`'s committed area that of the visible output: both survive a
simulated crash of the job. Only the :class:`MemorySinkWriter`'s open transactions live in
task memory (:meth:`MemorySink.crash` loses them).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable, Sequence

import pyarrow as pa

from spark_ckpt.errors import ProtocolError
from spark_ckpt.sinks.two_phase_commit import Transaction


class MemoryStaging:
    """Sealed, not yet committed transactions by transaction id: what the writer seals and
    the committer takes. Thread safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._staged: dict[str, list[pa.Table]] = {}

    def put(self, txn_id: str, tables: list[pa.Table]) -> None:
        with self._lock:
            self._staged[txn_id] = tables

    def take(self, txn_id: str) -> list[pa.Table] | None:
        """Remove and return the tables of *txn_id* (``None`` if it is not staged)."""
        with self._lock:
            return self._staged.pop(txn_id, None)

    def get(self, txn_id: str) -> list[pa.Table] | None:
        """The tables of *txn_id*, left staged (``None`` if it is not staged)."""
        with self._lock:
            found = self._staged.get(txn_id)
            return None if found is None else list(found)

    def drop_all(self) -> None:
        """Discard every staged transaction."""
        with self._lock:
            self._staged.clear()


class MemorySinkWriter:
    """The writer role (:class:`~spark_ckpt.sinks.two_phase_commit.SinkWriter`): open transactions
    in task memory, sealed into *staging*, for the sink named *sink_id*. Thread safe."""

    def __init__(self, staging: MemoryStaging, sink_id: str = "memory") -> None:
        self._lock = threading.Lock()
        self._staging = staging
        self.sink_id = sink_id
        self._open: dict[tuple[str, int], list[pa.Table]] = {}

    def write(self, operator_uid: str, subtask: int, table: pa.Table) -> None:
        with self._lock:
            self._open.setdefault((operator_uid, subtask), []).append(table)

    def pre_commit(self, operator_uid: str, subtask: int, checkpoint_id: int) -> Transaction:
        txn = Transaction(operator_uid, subtask, checkpoint_id, sink=self.sink_id)
        with self._lock:
            tables = self._open.pop((operator_uid, subtask), [])
        self._staging.put(txn.txn_id, tables)
        return txn

    def detach(self, operator_uid: str, subtask: int) -> tuple[str, ...]:
        """Stage the open transaction of (*operator_uid*, *subtask*) under a new id and hand
        the id over (:class:`~spark_ckpt.sinks.two_phase_commit.DetachableWriter`)."""
        with self._lock:
            tables = self._open.pop((operator_uid, subtask), [])
        if not tables:
            return ()
        staged = f"open-{operator_uid}-{subtask}-{uuid.uuid4().hex}"
        self._staging.put(staged, tables)
        return (staged,)

    def attach(self, operator_uid: str, subtask: int, staged: tuple[str, ...]) -> None:
        """Resume an open transaction :meth:`detach` handed over (it stays staged, so the
        same image may be loaded again, as a retried task does)."""
        tables: list[pa.Table] = []
        for name in staged:
            found = self._staging.get(name)
            if found is None:
                raise ProtocolError(f"open transaction {name} is not staged")
            tables += found
        with self._lock:
            self._open[(operator_uid, subtask)] = tables

    def crash(self) -> None:
        """Lose the open transactions (they were only in task memory)."""
        with self._lock:
            self._open.clear()


class MemorySinkCommitter:
    """The committer role (:class:`~spark_ckpt.sinks.two_phase_commit.SinkCommitter`): moves
    transactions from *staging* into its committed area. ``committed`` maps transaction
    ids to their tables; ``commit_calls`` counts :meth:`commit` calls (repeats included).
    *sink_id* names the sink (:attr:`~spark_ckpt.sinks.two_phase_commit.SinkCommitter.sink_id`)."""

    def __init__(self, staging: MemoryStaging, sink_id: str = "memory") -> None:
        self._lock = threading.Lock()
        self._staging = staging
        self.sink_id = sink_id
        self.committed: dict[str, list[pa.Table]] = {}
        self.commit_calls = 0
        self._committed_checkpoint = 0
        self._committed_at: dict[str, int] = {}  # txn id -> the checkpoint that committed it

    def commit(self, txn: Transaction) -> None:
        with self._lock:
            self.commit_calls += 1
            if txn.txn_id in self.committed:
                return
            staged = self._staging.take(txn.txn_id)
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
        *checkpoint_id* made visible (they become staged again, and the next recovery drops
        them) and set the committed checkpoint to *checkpoint_id*. Unlike the Delta sink it
        brings nothing back: it models restores of the current lineage only. Returns the
        withdrawn transaction ids (sorted); a no-op returning ``[]`` when the committed
        checkpoint is <= *checkpoint_id*."""
        with self._lock:
            if self._committed_checkpoint <= checkpoint_id:
                return []
            gone = sorted(t for t, c in self._committed_at.items() if c > checkpoint_id)
            for tid in gone:
                self._staging.put(tid, self.committed.pop(tid))  # staged again, as files stay
                del self._committed_at[tid]
            self._committed_checkpoint = checkpoint_id
            return gone

    def committed_checkpoint(self) -> int:
        return self._committed_checkpoint

    def abort(self, txn: Transaction) -> None:
        self._staging.take(txn.txn_id)

    def recover(
        self, to_commit: Sequence[Transaction], *, staged_before_ms: int | None = None
    ) -> None:
        """Commit every transaction of *to_commit* not yet committed — whatever the committed
        checkpoint, like :meth:`DeltaSinkCommitter.recover
        <spark_ckpt.delta.sink_committer.DeltaSinkCommitter.recover>`: after
        :meth:`roll_back_to` it may already be the restored one while transactions of it
        were withdrawn — raising the committed checkpoint to their largest id; then drop
        the other staged transactions. (Staging is in memory and
        synchronous here: *staged_before_ms* has no effect.)"""
        if to_commit:
            target = max(t.checkpoint_id for t in to_commit)
            self._committed_checkpoint = max(self._committed_checkpoint, target)
            for txn in to_commit:
                self.commit(txn)
        self._staging.drop_all()

    def output(self) -> pa.Table | None:
        """The committed rows (``None`` if there are none)."""
        tables: Iterable[pa.Table] = (t for ts in self.committed.values() for t in ts)
        tables = [t for t in tables if t.num_rows]
        return pa.concat_tables(tables) if tables else None


class MemorySink:
    """A :class:`~spark_ckpt.sinks.two_phase_commit.TransactionalSink` in memory: a writer and a
    committer over one :class:`MemoryStaging`, named *sink_id*."""

    def __init__(self, sink_id: str = "memory") -> None:
        staging = MemoryStaging()
        self.writer = MemorySinkWriter(staging, sink_id)
        self.committer = MemorySinkCommitter(staging, sink_id)

    def crash(self) -> None:
        """A crash of the job: the writer loses its open transactions; staged and committed
        data survive."""
        self.writer.crash()
