"""The sink transactions that acknowledgements carry, kept until their checkpoint's sink commit.

A task with a sink writes the transactions it sealed and whose commit it has not seen into
its snapshot, as one blob (:data:`~spark_ckpt.runtime.task.SINK_TRANSACTIONS`): that blob is
what a restore recovers the sink from. Its acknowledgement also carries the blob's rows
(:attr:`~spark_ckpt.protocol.state_handles.AcknowledgeCheckpoint.sealed`), so that the sink commit
after the checkpoint completes, in the coordinator host (the driver-side source runner), does
not read every task's blob back from the store. The carried rows are only trusted where
their Arrow encoding has the checksum and size of the blob the acknowledgement references:
a task that wrote the same checkpoint twice (a replayed micro-batch) acknowledges the blob of
its first write, which may hold other rows; such a blob, and any blob whose acknowledgement
this process did not receive (a restarted runner), is read from the store.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from spark_ckpt.protocol.state_handles import AcknowledgeCheckpoint, BlobRef, checksum, encode_table
from spark_ckpt.sinks.two_phase_commit import TRANSACTION_STATE_SCHEMA, Transaction

#: State name under which a task keeps its sealed, uncommitted sink transactions.
SINK_TRANSACTIONS = "_sink_transactions"


def sealed_table(rows: Sequence[str]) -> pa.Table:
    """The table of a task's sealed-transactions blob: one transaction's JSON per row."""
    return pa.table({"transaction": list(rows)}, schema=TRANSACTION_STATE_SCHEMA)


#: A blob's identity (:attr:`~spark_ckpt.protocol.state_handles.BlobRef.key`).
BlobKey = tuple[int, str, int, str, str, int, int, int, int]


class CarriedTransactions:
    """The verified transactions of the acknowledgements one coordinator host received, by
    the key of the blob they were written into. Not thread-safe: the host's thread owns it."""

    def __init__(self) -> None:
        self._by_blob: dict[BlobKey, tuple[str, tuple[Transaction, ...]]] = {}

    def record(self, ack: AcknowledgeCheckpoint) -> None:
        """Keep *ack*'s carried transactions if they are the rows of the sealed-transactions
        blob it references (see the module docstring); otherwise keep nothing."""
        if ack.sealed is None:
            return
        refs = [r for r in ack.state.blobs if r.state_name == SINK_TRANSACTIONS]
        if len(refs) != 1:
            return
        payload = encode_table(sealed_table(ack.sealed))
        ref = refs[0]
        if len(payload) != ref.nbytes or checksum(payload) != ref.checksum:
            return
        self._by_blob[ref.key] = (ref.checksum, tuple(Transaction.from_json(t) for t in ack.sealed))

    def lookup(self, ref: BlobRef) -> tuple[Transaction, ...] | None:
        """The transactions of blob *ref* (same key and checksum), if an acknowledgement
        carried them."""
        found = self._by_blob.get(ref.key)
        return found[1] if found is not None and found[0] == ref.checksum else None

    def forget_upto(self, checkpoint_id: int) -> None:
        """Drop what blobs written for checkpoints <= *checkpoint_id* carried (checkpoint
        *checkpoint_id* completed: older ones are subsumed)."""
        for key in [k for k in self._by_blob if k[0] <= checkpoint_id]:
            del self._by_blob[key]

    def forget(self, checkpoint_id: int) -> None:
        """Drop what blobs written for checkpoint *checkpoint_id* carried (it was aborted)."""
        for key in [k for k in self._by_blob if k[0] == checkpoint_id]:
            del self._by_blob[key]

    def __len__(self) -> int:
        return len(self._by_blob)
