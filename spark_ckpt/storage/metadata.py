"""Stored checkpoint metadata: parsing and verifying the rows a checkpoint log keeps.

Every store keeps one row per completed checkpoint, ``(id, (json, checksum))``: the canonical
JSON of the :class:`~spark_ckpt.protocol.checkpoint.CompletedCheckpoint` and its SHA-256. A
row that fails verification is reported as :class:`CorruptCheckpointError` carrying the
checkpoint's id; it never hides the rows that verify.
"""

from __future__ import annotations

from collections.abc import Iterable

from spark_ckpt.errors import CorruptCheckpointError
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint


def damaged_metadata(checkpoint_id: int, cause: CorruptCheckpointError) -> CorruptCheckpointError:
    """The error reported for a completed checkpoint whose metadata fails verification."""
    error = CorruptCheckpointError(
        f"checkpoint {checkpoint_id}: metadata is damaged: {cause}", checkpoint_id=checkpoint_id
    )
    error.__cause__ = cause
    return error


def parse_completed(
    rows: Iterable[tuple[int, tuple[str, str]]],
) -> tuple[list[CompletedCheckpoint], list[CorruptCheckpointError]]:
    """Parse and verify stored metadata rows ``(id, (json, checksum))``, oldest first: the
    checkpoints that verify, and one error (with ``checkpoint_id``) per row that does not —
    a bad checksum, malformed JSON, or a row whose JSON holds another id."""
    good: list[CompletedCheckpoint] = []
    bad: list[CorruptCheckpointError] = []
    for cid, (text, digest) in sorted(rows):
        try:
            c = CompletedCheckpoint.from_json(text, digest)
        except CorruptCheckpointError as e:
            bad.append(damaged_metadata(cid, e))
            continue
        if c.checkpoint_id != cid:
            bad.append(
                CorruptCheckpointError(
                    f"row of checkpoint {cid} holds checkpoint {c.checkpoint_id}",
                    checkpoint_id=cid,
                )
            )
            continue
        good.append(c)
    return good, bad
