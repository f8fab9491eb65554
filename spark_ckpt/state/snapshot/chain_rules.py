"""The rules of a keyed state's chain of blobs, ``[FULL, DELTA, DELTA, ...]`` (``BlobRef.seq``
0, 1, 2, ...): its shape (:func:`checked_chain`), and the limits past which an incremental
snapshot stops appending deltas to it (:func:`appendable`; what happens then:
:mod:`spark_ckpt.state.snapshot.strategy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from spark_ckpt.errors import CorruptCheckpointError
from spark_ckpt.protocol.state_handles import BlobKind, BlobRef

#: A chain holding this many deltas gets no further delta appended: the next change folds
#: its deltas into one, or replaces it by a FULL blob.
MAX_CHAIN_DELTAS: Final = 8
#: A chain whose delta rows (with the new delta) would exceed this fraction of the state's
#: live keys gets no further delta appended; nor does a fold that would: the chain is
#: replaced by a FULL blob.
MAX_DELTA_ROWS_RATIO: Final = 0.5


def checked_chain(refs: Sequence[BlobRef]) -> tuple[BlobRef, ...]:
    """The refs of one chain (one state of one subtask) in seq order; CorruptCheckpointError
    unless they are one FULL blob (seq 0) followed by DELTAs with seq 1, 2, ... without
    gaps, all covering the same key groups."""
    chain = sorted(set(refs), key=lambda r: r.seq)
    first = chain[0]
    for expected_seq, ref in enumerate(chain):
        expected_kind = BlobKind.KEYED_FULL if expected_seq == 0 else BlobKind.KEYED_DELTA
        if (
            ref.seq != expected_seq
            or ref.kind is not expected_kind
            or (ref.subtask, ref.key_group_start, ref.key_group_end)
            != (first.subtask, first.key_group_start, first.key_group_end)
        ):
            raise CorruptCheckpointError(
                f"state {first.state_name!r} of subtask {first.subtask}: chain "
                f"{[(r.kind.value, r.seq, r.key_group_start, r.key_group_end) for r in chain]} "
                "is not one full blob followed by consecutive deltas of the same key groups"
            )
    return tuple(chain)


def appendable(chain: tuple[BlobRef, ...], new_delta_rows: int, live_rows: int) -> bool:
    """Whether a delta of *new_delta_rows* rows may extend *chain*, given the state's
    *live_rows*: the chain holds fewer than :data:`MAX_CHAIN_DELTAS` deltas, and its delta
    rows with the new ones stay within :data:`MAX_DELTA_ROWS_RATIO` times *live_rows*."""
    if len(chain) - 1 >= MAX_CHAIN_DELTAS:
        return False
    delta_rows = sum(r.rows for r in chain[1:]) + new_delta_rows
    return delta_rows <= MAX_DELTA_ROWS_RATIO * live_rows
