"""The JSON documents of the checkpoint page's API, in the shape of Flink's REST API where it
fits (``/jobs/:jobid/checkpoints``, ``.../checkpoints/config``,
``.../checkpoints/details/:checkpointid``): the same keys and units (milliseconds, bytes,
epoch-millisecond timestamps, ``COMPLETED``/``FAILED``/``IN_PROGRESS``), plus what
spark-ckpt knows that Flink's UI does not show (failure reasons, rows in flight, keys
changed, runs and their restarts, source progress).

Pure functions of a :class:`~spark_ckpt.monitoring.root_view.RootView`; no I/O. The
counts and the summary are over the statistics history, the newest ``checkpoint.history``
records (Flink's ``web.checkpoints.history``), plus the checkpoints in progress.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from spark_ckpt.coordination.live_report import InProgress
from spark_ckpt.monitoring.root_view import RootView, RunView
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats
from spark_ckpt.protocol.state_handles import ChangeMetrics, StorageMetrics
from spark_ckpt.runtime.failure import is_aborted
from spark_ckpt.runtime.restore_settings import RESTORED_FROM
from spark_ckpt.runtime.stage import stage_names, stage_rows
from spark_ckpt.storage.history import CheckpointRecord

#: The statistics of a summary (Flink's ``StatsSummaryDto``).
SUMMARY_KEYS = ("min", "max", "avg", "p50", "p90", "p95", "p99", "p999")
_NO_CHANGES = ChangeMetrics()


def status_of(record: CheckpointRecord) -> str:
    """``completed``, ``failed`` or ``aborted`` (a reason that does not count as a failure:
    subsumed, cancelled, coordinator shutdown, fenced)."""
    if record.failure is None:
        return "completed"
    return "aborted" if is_aborted(record.failure) else "failed"


def summary(values: Sequence[float]) -> dict[str, float | None]:
    """Min, max, average and percentiles of *values* (linear interpolation between the
    closest ranks); every statistic None when there are none."""
    if not values:
        return dict.fromkeys(SUMMARY_KEYS)
    a = np.asarray(values, dtype=np.float64)
    q = np.quantile(a, [0.5, 0.9, 0.95, 0.99, 0.999])
    return {
        "min": float(a.min()),
        "max": float(a.max()),
        "avg": float(a.mean()),
        **{k: float(v) for k, v in zip(SUMMARY_KEYS[3:], q, strict=True)},
    }


def _checkpoint_type(record: CheckpointRecord, figures: CheckpointStats) -> str:
    if record.is_savepoint:
        return "SAVEPOINT"
    return "UNALIGNED_CHECKPOINT" if figures.channel_state_bytes else "CHECKPOINT"


def history_entry(record: CheckpointRecord, retained: Collection[int] = ()) -> dict[str, Any]:
    """One entry of ``history`` (and ``latest``): a finished checkpoint or savepoint.
    *retained*: the ids of the retained checkpoints (the others are ``discarded``)."""
    s = record.figures
    acked = len(s.task_metrics)
    failure = record.failure
    entry: dict[str, Any] = {
        "id": record.checkpoint_id,
        "status": "COMPLETED" if failure is None else "FAILED",
        "outcome": status_of(record),
        "is_savepoint": record.is_savepoint,
        "checkpoint_type": _checkpoint_type(record, s),
        "trigger_timestamp": s.trigger_ms,
        "latest_ack_timestamp": s.completed_ms if failure is None else None,
        "end_to_end_duration": s.end_to_end_ms,
        "checkpointed_size": s.bytes_written,
        "state_size": s.state_bytes,
        "persisted_data": s.channel_state_bytes,
        "alignment_duration": s.max_alignment_ms,
        "start_delay": s.max_start_delay_ms,
        "in_flight_rows": s.in_flight_rows,
        "keys_changed": s.keys_changed,
        "num_subtasks": acked if failure is None else (failure.subtasks or None),
        "num_acknowledged_subtasks": acked,
        "discarded": record.checkpoint_id not in retained,
        "restored_from": record.properties.get(RESTORED_FROM),
    }
    if failure is not None:
        entry |= {
            "failure_timestamp": failure.failed_ms,
            "failure_reason": failure.reason,
            "failure_message": failure.message,
        }
    return entry


def in_progress_entry(p: InProgress, now_ms: int) -> dict[str, Any]:
    """A checkpoint in progress, as ``history`` shows one (Flink's ``IN_PROGRESS``)."""
    savepoint = p.snapshot_type is SnapshotType.SAVEPOINT
    return {
        "id": p.checkpoint_id,
        "status": "IN_PROGRESS",
        "outcome": "in_progress",
        "is_savepoint": savepoint,
        "checkpoint_type": "SAVEPOINT" if savepoint else "CHECKPOINT",
        "trigger_timestamp": p.trigger_ms,
        "end_to_end_duration": max(0, now_ms - p.trigger_ms),
        "num_subtasks": p.total,
        "num_acknowledged_subtasks": p.acknowledged,
    }


def _storage_entry(m: StorageMetrics | None) -> dict[str, Any] | None:
    """A subtask's state backend: its name, what it holds, ``rocksdb``'s cache hit rate."""
    if m is None:
        return None
    return {**m.to_dict(), "cache_hit_rate": m.cache_hit_rate}


def subtask_entries(record: CheckpointRecord) -> list[dict[str, Any]]:
    """Per subtask of a finished checkpoint: Flink's subtask statistics (``checkpoint``:
    sync and async durations; ``alignment``: duration and persisted bytes; start delay;
    state size) with spark-ckpt's bytes written, keys changed and rows in flight, and for
    subtasks on the executors where they found their state. A failed checkpoint lists the
    subtasks that had acknowledged."""
    s = record.figures
    out = []
    for task, m in sorted(s.task_metrics.items(), key=lambda item: _task_order(item[0])):
        c = s.task_changes.get(task, _NO_CHANGES)
        cache = s.task_cache.get(task)
        time = s.task_time.get(task)
        out.append(
            {
                "subtask": task,
                "index": _task_order(task)[1],
                "status": "completed",
                "checkpoint": {"sync": m.sync_ms, "async": m.async_ms},
                "alignment": {"duration": m.alignment_ms, "persisted": m.channel_state_bytes},
                "start_delay": m.start_delay_ms,
                "state_size": m.state_bytes,
                "checkpointed_size": c.bytes_written,
                "keys_changed": c.keys_changed,
                "in_flight_rows": c.in_flight_rows,
                "cache": None if cache is None else cache.to_dict(),
                "state_backend": _storage_entry(s.task_storage.get(task)),
                "time": None if time is None else time.to_dict(),
            }
        )
    return out


def stage_entries(record: CheckpointRecord) -> list[dict[str, Any]]:
    """Per keyed stage of a finished checkpoint (Flink's per-vertex summary): its name,
    vertex, subtasks that acknowledged, state size, bytes written and the longest alignment
    and synchronous and asynchronous phases among its subtasks."""
    s = record.figures
    tasks = []
    for task, m in s.task_metrics.items():
        vertex, index = _task_order(task)
        tasks.append((vertex, index, m.state_bytes))
    out: list[dict[str, Any]] = []
    for row in stage_rows(tasks, stage_names(record.properties)):
        mine = [(t, m) for t, m in s.task_metrics.items() if _task_order(t)[0] == row["vertex"]]
        out.append(
            {
                **row,
                "checkpointed_size": sum(
                    s.task_changes.get(t, _NO_CHANGES).bytes_written for t, _ in mine
                ),
                "alignment": max(m.alignment_ms for _, m in mine),
                "sync": max(m.sync_ms for _, m in mine),
                "async": max(m.async_ms for _, m in mine),
            }
        )
    return out


def _task_order(task: str) -> tuple[str, int]:
    """``vertex#3`` sorts as (vertex, 3)."""
    vertex, _, index = task.rpartition("#")
    return (vertex, int(index)) if index.isdigit() else (task, -1)


def details(view: RootView, checkpoint_id: int) -> dict[str, Any] | None:
    """``/checkpoints/details/<id>``: the history entry with its subtasks, its properties
    and (a retained checkpoint) its source positions; None when the history holds no such
    checkpoint."""
    record = next((r for r in view.records if r.checkpoint_id == checkpoint_id), None)
    if record is None:
        return None
    retained = {c.checkpoint_id: c for c in view.retained}
    entry = history_entry(record, retained)
    entry["subtasks"] = subtask_entries(record)
    entry["stages"] = stage_entries(record)
    entry["properties"] = dict(sorted(record.properties.items()))
    cp = retained.get(checkpoint_id)
    entry["source_positions"] = (
        None
        if cp is None
        else [
            {"source": v, "channel": c, "offset": o} for (v, c), o in sorted(cp.offsets().items())
        ]
    )
    return entry


def counts(view: RootView) -> dict[str, int]:
    """Flink's counts over the history and the checkpoints in progress: ``failed`` counts
    every finished checkpoint that did not complete (as Flink's), ``aborted`` those of them
    whose reason does not count against ``checkpoint.tolerable-failures``; ``restored``: the
    runs that restored from a checkpoint."""
    statuses = [status_of(r) for r in view.records]
    in_progress = sum(len(r.in_progress) for r in view.live)
    completed = statuses.count("completed")
    failed = statuses.count("failed") + statuses.count("aborted")
    return {
        "restored": sum(1 for r in view.runs if _restored_id(r) is not None),
        "total": completed + failed + in_progress,
        "in_progress": in_progress,
        "completed": completed,
        "savepoints": sum(r.failure is None and r.is_savepoint for r in view.records),
        "failed": failed,
        "aborted": statuses.count("aborted"),
    }


def _restored_id(run: RunView) -> int | None:
    if run.restore is not None:
        return run.restore.checkpoint_id
    return run.status.restored_from


def restored(view: RootView) -> dict[str, Any] | None:
    """``latest.restored``: the newest run that restored from a checkpoint or savepoint, and
    what an explicit restore named (``restored_from``; None for a restart from the latest
    checkpoint)."""
    for run in reversed(view.runs):
        cid = _restored_id(run)
        if cid is None:
            continue
        record = next((r for r in view.records if r.checkpoint_id == cid), None)
        at = run.restore.at_ms if run.restore is not None else None
        return {
            "id": cid,
            "restore_timestamp": at if at is not None else run.status.updated_ms,
            "is_savepoint": None if record is None else record.is_savepoint,
            # an explicit restore (a savepoint, another root, a time) derived checkpoint cid
            # from what it names: "savepoint /path", "checkpoint 12 of /root", ...
            "restored_from": None if record is None else record.properties.get(RESTORED_FROM),
            "run_id": run.status.run_id,
            "attempt": run.status.attempt,
        }
    return None


def checkpoints(view: RootView) -> dict[str, Any]:
    """``/checkpoints``: counts, summary, latest, history (newest first, as Flink's, the
    checkpoints in progress on top), and spark-ckpt's own sections: the pipeline, the runs,
    the source channels' progress."""
    retained = {c.checkpoint_id for c in view.retained}
    stats = [r.stats for r in view.records if r.stats is not None]
    finished = [history_entry(r, retained) for r in reversed(view.records)]
    live = [
        in_progress_entry(p, view.read_ms)
        for report in view.live
        for p in sorted(report.in_progress, key=lambda p: -p.checkpoint_id)
    ]

    return {
        "pipeline": view.pipeline,
        "root": view.root,
        "read_timestamp": view.read_ms,
        "running": view.running,
        "counts": counts(view),
        "summary": {
            "end_to_end_duration": summary([s.end_to_end_ms for s in stats]),
            "checkpointed_size": summary([s.bytes_written for s in stats]),
            "state_size": summary([s.state_bytes for s in stats]),
            "persisted_data": summary([s.channel_state_bytes for s in stats]),
            "alignment_duration": summary([s.max_alignment_ms for s in stats]),
            "start_delay": summary([s.max_start_delay_ms for s in stats]),
        },
        "latest": {
            "completed": next(
                (e for e in finished if e["status"] == "COMPLETED" and not e["is_savepoint"]), None
            ),
            "savepoint": next(
                (e for e in finished if e["status"] == "COMPLETED" and e["is_savepoint"]), None
            ),
            "failed": next((e for e in finished if e["status"] == "FAILED"), None),
            "restored": restored(view),
        },
        "history": live + finished,
        "runs": [run_entry(r) for r in reversed(view.runs)],
        "sources": [
            {"run_id": report.run_id, "at": report.at_ms, **c.to_dict(), "pending": c.pending}
            for report in view.live
            for c in report.channels
        ],
    }


def run_entry(run: RunView) -> dict[str, Any]:
    """A run: its attempt, state, last update, what it restored from and why it ended
    (a failed run's error is the cause of the restart after it)."""
    s = run.status
    return {
        "run_id": s.run_id,
        "attempt": s.attempt,
        "state": s.state.value,
        "updated": s.updated_ms,
        "restored_from": _restored_id(run),
        "restore_timestamp": None if run.restore is None else run.restore.at_ms,
        "skipped": [] if run.restore is None else [k.to_dict() for k in run.restore.skipped],
        "error": s.error,
    }


def config(view: RootView) -> dict[str, Any] | None:
    """``/checkpoints/config``: the checkpoint configuration of the current run (see
    :attr:`RootView.config`) in Flink's keys; None when no run recorded one."""
    c = view.config
    if c is None:
        return None
    retention = str(c.get("externalized_retention", ""))
    unaligned = bool(c.get("unaligned", False))
    exactly_once = str(c.get("mode", "EXACTLY_ONCE")) == "EXACTLY_ONCE"
    timeout = int(c.get("aligned_checkpoint_timeout_ms", 0) or 0)
    return {
        "mode": "exactly_once" if exactly_once else "at_least_once",
        "alignment": _alignment_label(exactly_once, unaligned, timeout),
        "interval": c.get("interval_ms"),
        "timeout": c.get("timeout_ms"),
        "min_pause": c.get("min_pause_ms"),
        "max_concurrent": c.get("max_concurrent"),
        "externalization": {
            "enabled": retention != "NO_EXTERNALIZED_CHECKPOINTS",
            "delete_on_cancellation": retention == "DELETE_ON_CANCELLATION",
        },
        "unaligned_checkpoints": unaligned,
        "aligned_checkpoint_timeout": timeout,
        "tolerable_failed_checkpoints": c.get("tolerable_failed_checkpoints"),
        "retained_checkpoints": c.get("retained_checkpoints"),
        "history_size": c.get("history_size"),
        "checkpoint_storage": c.get("checkpoint_storage") or view.root,
        "savepoint_dir": c.get("savepoint_dir"),
        "restart_strategy": c.get("restart_strategy"),
    }


def _alignment_label(exactly_once: bool, unaligned: bool, timeout_ms: int) -> str:
    if not exactly_once:
        return "at-least-once"
    if not unaligned:
        return "aligned"
    return f"aligned with a {timeout_ms} ms timeout" if timeout_ms else "unaligned"
