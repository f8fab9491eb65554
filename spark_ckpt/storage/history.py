"""The checkpoint statistics history: one record per finished checkpoint or savepoint,
completed or failed, kept apart from the checkpoints themselves and bounded by its own size.

Flink's ``CheckpointStatsTracker`` keeps such a history (``web.checkpoints.history``
entries) in the JobManager's memory, independent of how many checkpoints are retained for
recovery. Here it is kept in the checkpoint store, so it outlives the coordinator: every
store keeps the newest ``history_size`` records by checkpoint id (option
``checkpoint.history``, :data:`DEFAULT_HISTORY_SIZE` by default). Retention of checkpoints
never deletes a record; it records a completed checkpoint before its log row goes.

A :class:`CheckpointRecord` holds the figures only, never state: for a completed checkpoint
its :class:`~spark_ckpt.protocol.checkpoint.CheckpointStats` (timestamps, sizes, per-subtask
metrics) and properties; for a failed or aborted one the
:class:`~spark_ckpt.protocol.checkpoint.FailedCheckpoint` (reason, message, the figures of
the subtasks that had acknowledged). Its canonical JSON (:meth:`CheckpointRecord.to_json`)
is what a store persists and checksums.

The rules every store applies (pure functions, shared):

* :func:`bounded` — the newest *size* records by id. The history also keeps its *floor*:
  one more than the largest id the bound ever dropped (0 at first).
* :func:`unrecorded` — which completed checkpoints still in the log are not in the history
  yet: those not recorded whose id is at least the floor. A record that the bound dropped
  (an old savepoint, say, which retention never removes) is therefore never recorded
  again, while a store written before the history existed (nothing recorded, floor 0) has
  every completed checkpoint of its log recorded.
* :func:`merge_history` — what a reader sees: the records, plus what :func:`unrecorded`
  would record (it is recorded at the next write), by id.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from spark_ckpt.errors import ConfigError, CorruptCheckpointError, RestoreError
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint, FailedCheckpoint

#: How many records the history keeps by default (Flink's ``web.checkpoints.history`` is 10).
DEFAULT_HISTORY_SIZE = 100


class RecordStatus(StrEnum):
    """How a checkpoint finished: completed, or failed/aborted (see the record's ``reason``)."""

    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True)
class CheckpointRecord:
    """One finished checkpoint or savepoint in the statistics history. Exactly one of
    *stats* (completed) and *failure* (failed or aborted) is set — build records with
    :meth:`completed` and :meth:`failed`; :attr:`figures` gives the statistics of either."""

    checkpoint_id: int
    snapshot_type: SnapshotType
    stats: CheckpointStats | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    failure: FailedCheckpoint | None = None

    @staticmethod
    def completed(checkpoint: CompletedCheckpoint) -> CheckpointRecord:
        """The record of a completed checkpoint (its figures and properties, no state)."""
        return CheckpointRecord(
            checkpoint.checkpoint_id,
            checkpoint.snapshot_type,
            stats=checkpoint.stats,
            properties=dict(checkpoint.properties),
        )

    @staticmethod
    def failed(failure: FailedCheckpoint) -> CheckpointRecord:
        """The record of a failed or aborted checkpoint."""
        return CheckpointRecord(failure.checkpoint_id, failure.snapshot_type, failure=failure)

    @property
    def status(self) -> RecordStatus:
        return RecordStatus.COMPLETED if self.failure is None else RecordStatus.FAILED

    @property
    def is_savepoint(self) -> bool:
        return self.snapshot_type is SnapshotType.SAVEPOINT

    @property
    def figures(self) -> CheckpointStats:
        """The statistics: a completed checkpoint's own; for a failed one, trigger and
        failure time (as ``completed_ms``) and the sums and metrics of the subtasks that had
        acknowledged (nothing was written for it: ``bytes_written`` 0)."""
        if self.stats is not None:
            return self.stats
        f = self.failure
        assert f is not None
        return CheckpointStats(
            trigger_ms=f.trigger_ms,
            completed_ms=f.failed_ms,
            state_bytes=sum(m.state_bytes for m in f.task_metrics.values()),
            channel_state_bytes=sum(m.channel_state_bytes for m in f.task_metrics.values()),
            task_metrics=f.task_metrics,
        )

    @property
    def reason(self) -> str:
        """The failure reason ('' when completed)."""
        return self.failure.reason if self.failure is not None else ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "checkpoint_id": self.checkpoint_id,
            "type": self.snapshot_type.value,
            "status": self.status.value,
        }
        if self.stats is not None:
            out["stats"] = self.stats.to_dict()
            out["properties"] = dict(sorted(self.properties.items()))
        else:
            assert self.failure is not None
            out["failure"] = self.failure.to_dict()
        return out

    def to_json(self) -> str:
        """The canonical JSON a store persists."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def checksum(self) -> str:
        """SHA-256 of :meth:`to_json`."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @staticmethod
    def from_json(text: str, expected_checksum: str | None = None) -> CheckpointRecord:
        """Decode :meth:`to_json`; with *expected_checksum*, verify it first. Raises
        :class:`CorruptCheckpointError` for a record that fails either."""
        digest = hashlib.sha256(text.encode()).hexdigest()
        if expected_checksum is not None and digest != expected_checksum:
            raise CorruptCheckpointError("checkpoint history record fails its checksum")
        try:
            d = json.loads(text)
            status = RecordStatus(d["status"])
            if status is RecordStatus.FAILED:
                return CheckpointRecord.failed(FailedCheckpoint.from_json(json.dumps(d["failure"])))
            return CheckpointRecord(
                int(d["checkpoint_id"]),
                SnapshotType(d["type"]),
                stats=CheckpointStats.from_dict(d["stats"]),
                properties={str(k): str(v) for k, v in d.get("properties", {}).items()},
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptCheckpointError(f"checkpoint history record is malformed: {e}") from e


def check_history_size(size: int) -> int:
    """*size* if it is a valid history bound (an integer >= 1); :class:`ConfigError`
    otherwise."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError("history_size", size, "an integer >= 1")
    return size


def unrecorded(
    recorded_ids: Iterable[int],
    completed: Iterable[CompletedCheckpoint],
    failed: Iterable[FailedCheckpoint] = (),
    *,
    floor: int = 0,
) -> list[CheckpointRecord]:
    """The records still to be written for the log's *completed* checkpoints and its older
    *failed* rows (written before the history existed): those whose id is not recorded and
    at least *floor*, by id."""
    ids = set(recorded_ids)
    out: dict[int, CheckpointRecord] = {}
    candidates = [CheckpointRecord.completed(c) for c in completed]
    candidates += [CheckpointRecord.failed(f) for f in failed]
    for r in candidates:
        if r.checkpoint_id not in ids and r.checkpoint_id >= floor:
            out.setdefault(r.checkpoint_id, r)
    return [out[k] for k in sorted(out)]


def merge_history(
    recorded: Iterable[CheckpointRecord],
    completed: Iterable[CompletedCheckpoint],
    failed: Iterable[FailedCheckpoint] = (),
    *,
    floor: int = 0,
) -> list[CheckpointRecord]:
    """What a reader of the history sees: *recorded*, plus the :func:`unrecorded` ones of
    the log, by id."""
    by_id = {r.checkpoint_id: r for r in recorded}
    for r in unrecorded(by_id, completed, failed, floor=floor):
        by_id[r.checkpoint_id] = r
    return [by_id[k] for k in sorted(by_id)]


def completed_as_of(times: Mapping[int, int], floor: int, at_ms: int, where: str) -> int:
    """The id of the latest checkpoint or savepoint (the largest id) that had completed at or
    before *at_ms* (epoch ms), from *times*: the completion time of every completed checkpoint
    the store still knows (its log's completed rows and the history's completed records) by
    id, and the history's *floor* (:func:`bounded`).

    Why that is the answer Delta time travel on the log would give: a checkpoint's record is
    written to the history before retention removes it from the log, and the history drops
    only records below its floor. So every checkpoint with an id at or above ``floor - 1``
    that ever completed is in *times*; an answer below that is refused, since one with an id
    between it and the floor may have completed before *at_ms* and been forgotten. The caller
    refuses an answer that is no longer retained, as it refuses an id. Raises
    :class:`RestoreError` (naming *where*, the store) when nothing known completed by then or
    the answer is uncertain."""
    done = [cid for cid, t in times.items() if t <= at_ms]
    if not done:
        forgotten = f" (the history forgot the checkpoints below id {floor})" if floor else ""
        raise RestoreError(
            f"no checkpoint of {where} that the store still knows had completed at or before "
            f"that time{forgotten}"
        )
    latest = max(done)
    if latest < floor - 1:
        raise RestoreError(
            f"the latest checkpoint of {where} completed by then is not known any more: the "
            f"newest one known is {latest}, but the history forgot the checkpoints below id "
            f"{floor}, and one of those may have completed later (restore it by id instead)"
        )
    return latest


def bounded(ids: Iterable[int], size: int, floor: int = 0) -> tuple[list[int], int]:
    """The newest *size* of *ids* (sorted), and the floor after dropping the others: one
    more than the largest dropped id, or *floor* if that is larger."""
    check_history_size(size)
    ordered = sorted(set(ids))
    cut = max(0, len(ordered) - size)
    if cut:
        floor = max(floor, ordered[cut - 1] + 1)
    return ordered[cut:], floor
