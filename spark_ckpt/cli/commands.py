"""The commands of ``spark-ckpt`` (see :mod:`spark_ckpt.cli` for the command line).

Each command takes the parsed arguments, prints a readable table (or JSON lines with
``--json``) to stdout and returns the exit status. Bad input raises a
:class:`~spark_ckpt.errors.SparkCkptError`, which :func:`spark_ckpt.cli.main` prints as one
``error: …`` line (exit status 2); a request nobody answered exits with 1.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from spark_ckpt.cli.table import Row, json_lines, render, size, when
from spark_ckpt.errors import CheckpointError, CheckpointNotFoundError, ConfigError
from spark_ckpt.locations.preflight import check_readable
from spark_ckpt.locations.uris import normalized
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.state_handles import CheckpointMetrics, TimeMetrics
from spark_ckpt.runtime.stage import stage_names, stage_rows
from spark_ckpt.sources.kafka_options import CHANNEL_NAMES

if TYPE_CHECKING:
    from spark_ckpt.client.pipeline_client import PipelineClient
    from spark_ckpt.storage.history import CheckpointRecord


_NO_METRICS = CheckpointMetrics()


def client(root: str, *, existing: bool = True) -> PipelineClient:
    """The client of the pipeline root *root*. For queries (*existing*):
    :class:`CheckpointNotFoundError` if there is no pipeline root there (a local path that
    does not exist or has no checkpoint log). Requests need none: a pipeline that is starting
    may not have written its log yet, and an unanswered request times out."""
    from spark_ckpt.client.pipeline_client import PipelineClient

    root = normalized(root)
    fs, path = check_readable(root)  # an object store: one clear line before anything runs
    if existing and fs.get_file_info(f"{path}/checkpoints").type != pafs.FileType.Directory:
        raise CheckpointNotFoundError(f"no pipeline root at {root}")
    return PipelineClient(root)


def emit(
    args: argparse.Namespace, rows: Sequence[Row], columns: Sequence[str] | None = None
) -> None:
    print(json_lines(rows) if args.json else render(rows, columns))


def figure_cells(s: CheckpointStats) -> dict[str, Any]:
    """The figures of a checkpoint as table cells (sizes human-readable), shared by the
    tables of retained checkpoints and of the statistics history."""
    return {
        "duration_ms": s.end_to_end_ms,
        "state": size(s.state_bytes),
        "written": size(s.bytes_written),
        "channel_state": size(s.channel_state_bytes),
        "alignment_ms": s.max_alignment_ms,
        "start_delay_ms": s.max_start_delay_ms,
    }


def time_cells(s: CheckpointStats | TimeMetrics) -> dict[str, Any]:
    """Time at a checkpoint (a pipeline that keeps it), of the pipeline or one subtask: the
    watermark, and since the previous checkpoint the rows that arrived late and were dropped,
    the timers registered and fired, and the entries of states with a TTL that expired."""
    return {"watermark": when(s.watermark_ms)} | _time_counts(s)


def _time_counts(s: CheckpointStats | TimeMetrics) -> dict[str, int]:
    return {
        "late_rows": s.late_rows,
        "dropped_rows": s.dropped_rows,
        "timers_registered": s.timers_registered,
        "timers_fired": s.timers_fired,
        "ttl_expired": s.ttl_expired,
    }


def _subtask_time_cells(cp: CompletedCheckpoint, task: str) -> dict[str, Any]:
    time = cp.stats.task_time.get(task)
    return {} if time is None else time_cells(time)


def _cache_cells(cp: CompletedCheckpoint, task: str) -> dict[str, int]:
    """Where a subtask on the executors found its state since its previous checkpoint
    (nothing for subtasks in the driver)."""
    cache = cp.stats.task_cache.get(task)
    if cache is None:
        return {}
    return {
        "cache_hits": cache.hits,
        "hit_ms": cache.hit_ms,
        "rebuilds": cache.rebuilds,
        "rebuild_ms": cache.rebuild_ms,
    }


def _storage_cells(cp: CompletedCheckpoint, task: str) -> dict[str, Any]:
    """A subtask's state backend and what it holds (nothing for a task without keyed
    state, or a checkpoint of an older version)."""
    m = cp.stats.task_storage.get(task)
    if m is None:
        return {}
    rate = m.cache_hit_rate
    return {
        "backend": m.backend,
        "in_memory": size(m.memory_bytes),
        "on_disk": size(m.disk_bytes),
        "cache_hit_rate": "" if rate is None else f"{100 * rate:.1f}%",
    }


def checkpoint_row(cp: CompletedCheckpoint, *, timed: bool = False) -> dict[str, Any]:
    """A retained checkpoint's table row; *timed*: with the event-time cells."""
    s = cp.stats
    return {
        "id": cp.checkpoint_id,
        "type": cp.snapshot_type.value,
        "completed": when(s.completed_ms),
        **figure_cells(s),
        **(time_cells(s) if timed else {}),
        "restored_from": cp.properties.get("restored_from", ""),
    }


def checkpoint_json(cp: CompletedCheckpoint) -> dict[str, Any]:
    s = cp.stats
    return {
        "id": cp.checkpoint_id,
        "type": cp.snapshot_type.value,
        "trigger_ms": s.trigger_ms,
        "completed_ms": s.completed_ms,
        "duration_ms": s.end_to_end_ms,
        "state_bytes": s.state_bytes,
        "bytes_written": s.bytes_written,
        "channel_state_bytes": s.channel_state_bytes,
        "alignment_ms": s.max_alignment_ms,
        "start_delay_ms": s.max_start_delay_ms,
        "offsets": {f"{k[0]}/{k[1]}": v for k, v in sorted(cp.offsets().items())},
        "properties": dict(cp.properties),
    } | (_time_json(s) if s.task_time else {})


def _time_json(s: CheckpointStats) -> dict[str, Any]:
    return {"watermark_ms": s.watermark_ms} | _time_counts(s)


# -- checkpoints ------------------------------------------------------------------------------
def checkpoints_list(args: argparse.Namespace) -> int:
    cps = client(args.root).checkpoints()
    if args.json:
        print(json_lines([checkpoint_json(c) for c in cps]))
    else:
        timed = any(c.stats.task_time for c in cps)
        print(render([checkpoint_row(c, timed=timed) for c in cps]))
    return 0


def checkpoints_show(args: argparse.Namespace) -> int:
    cp = client(args.root).store.get(args.id)
    if args.json:
        detail = checkpoint_json(cp)
        detail["tasks"] = [
            {
                "task": str(t.task),
                **cp.stats.task_metrics.get(str(t.task), _NO_METRICS).to_dict(),
                **_cache_cells(cp, str(t.task)),
                **(
                    {"state_backend": cp.stats.task_storage[str(t.task)].to_dict()}
                    if str(t.task) in cp.stats.task_storage
                    else {}
                ),
                **(
                    cp.stats.task_time[str(t.task)].to_dict()
                    if str(t.task) in cp.stats.task_time
                    else {}
                ),
            }
            for t in cp.tasks
        ]
        detail["blobs"] = [b.to_dict() for b in cp.blobs()]
        detail["stages"] = _stages(cp)
        print(json_lines([detail]))
        return 0
    print(render([checkpoint_row(cp, timed=bool(cp.stats.task_time))]))
    print("\nproperties")
    print(render([{"key": k, "value": v} for k, v in sorted(cp.properties.items())]))
    print("\nsubtasks")
    rows = []
    for t in cp.tasks:
        m = cp.stats.task_metrics.get(str(t.task), _NO_METRICS)
        rows.append(
            {
                "subtask": str(t.task),
                "sync_ms": m.sync_ms,
                "async_ms": m.async_ms,
                "alignment_ms": m.alignment_ms,
                "start_delay_ms": m.start_delay_ms,
                "state": size(t.state_bytes()),
                "channel_state": size(t.channel_state_bytes()),
                **_cache_cells(cp, str(t.task)),
                **_storage_cells(cp, str(t.task)),
                **_subtask_time_cells(cp, str(t.task)),
            }
        )
    print(render(rows))
    stages = _stages(cp)
    if len(stages) > 1:
        print("\nstages")
        print(render([{**r, "state_bytes": size(int(str(r["state_bytes"])))} for r in stages]))
    print("\nstate")
    states: dict[tuple[str, str, str], list[int]] = {}
    for b in cp.blobs():
        agg = states.setdefault((b.operator_uid, b.state_name, b.kind.value), [0, 0, 0])
        agg[0] += 1
        agg[1] += b.rows
        agg[2] += b.nbytes
    print(
        render(
            [
                {"uid": u, "state": n, "kind": k, "blobs": a[0], "rows": a[1], "size": size(a[2])}
                for (u, n, k), a in sorted(states.items())
            ]
        )
    )
    print("\nsource positions")
    names = channel_names(cp)  # Kafka partitions, several inputs' channels
    rows = [
        {"source": s, "channel": c, "offset": o}
        | ({} if names is None else {"name": names[c] if c < len(names) else ""})
        for (s, c), o in sorted(cp.offsets().items())
    ]
    print(render(rows))
    return 0


def _stages(cp: CompletedCheckpoint) -> list[dict[str, object]]:
    """Per keyed stage of *cp*: its name, vertex, subtasks and state size."""
    tasks = [(t.task.vertex, t.task.subtask, t.state_bytes()) for t in cp.tasks]
    return stage_rows(tasks, stage_names(cp.properties))


def channel_names(cp: CompletedCheckpoint) -> list[str] | None:
    """The names of *cp*'s source channels, when the source names them (None: it does
    not)."""
    recorded = cp.properties.get(CHANNEL_NAMES)
    if recorded is None:
        return None
    try:
        return [str(n) for n in json.loads(recorded)]
    except (TypeError, ValueError):
        return None


# -- requests ---------------------------------------------------------------------------------
def checkpoints_pause(args: argparse.Namespace) -> int:
    """``checkpoints pause``: no periodic checkpoints until ``checkpoints resume``."""
    try:
        pause = client(args.root, existing=False).pause_checkpoints(timeout_s=args.timeout)
    except CheckpointError as e:
        print(f"error: {e}", flush=True, file=_stderr())
        return 1
    since = pause.since_ms if args.json else when(pause.since_ms)
    emit(args, [{"periodic_checkpoints": "paused", "since": since}])
    return 0


def checkpoints_resume(args: argparse.Namespace) -> int:
    """``checkpoints resume``: periodic checkpoints again."""
    try:
        client(args.root, existing=False).resume_checkpoints(timeout_s=args.timeout)
    except CheckpointError as e:
        print(f"error: {e}", flush=True, file=_stderr())
        return 1
    emit(args, [{"periodic_checkpoints": "running"}])
    return 0


def _answer(args: argparse.Namespace, cp: CompletedCheckpoint, extra: dict[str, Any]) -> None:
    row = {**checkpoint_json(cp), **extra} if args.json else {**checkpoint_row(cp), **extra}
    emit(args, [row])


def checkpoint_trigger(args: argparse.Namespace) -> int:
    c = client(args.root, existing=False)
    try:
        cp = c.checkpoint(timeout_s=args.timeout)
    except CheckpointError as e:
        print(f"error: {e}", flush=True, file=_stderr())
        return 1
    _answer(args, cp, {})
    return 0


def savepoint_trigger(args: argparse.Namespace) -> int:
    c = client(args.root, existing=False)
    try:
        sp = c.savepoint(args.target, timeout_s=args.timeout)
        path = _exported(c, sp, args.timeout)
    except CheckpointError as e:
        print(f"error: {e}", flush=True, file=_stderr())
        return 1
    _answer(args, sp, {"path": path})
    return 0


def stop(args: argparse.Namespace) -> int:
    """``stop`` and ``savepoint stop``: a final checkpoint (or savepoint), then the run ends."""
    c = client(args.root, existing=False)
    savepoint = bool(getattr(args, "savepoint", False))
    try:
        final = c.stop(savepoint=savepoint, drain=args.drain, timeout_s=args.timeout)
        extra = {"path": _exported(c, final, args.timeout)} if final.is_savepoint else {}
    except CheckpointError as e:
        print(f"error: {e}", flush=True, file=_stderr())
        return 1
    _answer(args, final, extra)
    return 0


def _exported(c: PipelineClient, savepoint: CompletedCheckpoint, timeout_s: float) -> str:
    from spark_ckpt.coordination.savepoint_export import wait_exported

    return wait_exported(c.root, savepoint, timeout_s).path


def _stderr() -> Any:
    import sys

    return sys.stderr


# -- savepoints -------------------------------------------------------------------------------
def savepoint_list(args: argparse.Namespace) -> int:
    from spark_ckpt.delta.savepoint import DEFAULT_SUBDIR, list_savepoints

    if args.dir is None and args.root is None:
        raise ConfigError("savepoint list", "", "--dir DIR or --root ROOT")
    directory = args.dir or os.path.join(args.root, DEFAULT_SUBDIR)
    if "://" not in directory and not os.path.isdir(directory):
        raise CheckpointNotFoundError(f"no savepoint directory at {os.path.abspath(directory)}")
    found = list_savepoints(directory)
    rows = [
        {
            "path": s.path,
            "id": s.checkpoint.checkpoint_id,
            "pipeline": s.pipeline,
            "completed": when(s.checkpoint.stats.completed_ms),
            "state": size(s.checkpoint.stats.state_bytes),
        }
        for s in found
    ]
    emit(args, rows)
    return 0


def savepoint_dispose(args: argparse.Namespace) -> int:
    from spark_ckpt.delta.savepoint import dispose_savepoint

    gone = dispose_savepoint(args.path)
    emit(args, [{"disposed": gone.path, "id": gone.checkpoint.checkpoint_id}])
    return 0


# -- state ------------------------------------------------------------------------------------
def state_read(args: argparse.Namespace) -> int:
    from spark_ckpt.offline import StateReader

    if "://" not in args.path and not os.path.isdir(args.path):
        raise CheckpointNotFoundError(f"no checkpoint store at {os.path.abspath(args.path)}")
    reader = StateReader.open(args.path, args.checkpoint)
    if args.uid is None:
        rows = [
            {"uid": uid, "state": name, "kind": reader.state_kind(uid, name)}
            for uid in reader.uids()
            for name in reader.state_names(uid)
        ]
        emit(args, rows)
        return 0
    if args.state is None:
        raise ConfigError("state read", "", "--state NAME with --uid (list them without --uid)")
    if args.state in reader.keyed_state_names(args.uid):
        table = reader.keyed(args.uid, args.state)
    else:
        table = reader.operator_state(args.uid, args.state)
    if args.out:
        _write_table(table, args.out)
        print(f"{table.num_rows} rows written to {args.out}")
        return 0
    rows = table.slice(0, args.limit).to_pylist() if args.limit else table.to_pylist()
    emit(args, rows)
    if not args.json and args.limit and table.num_rows > args.limit:
        print(f"... {table.num_rows - args.limit} more rows (--limit 0 for all, --out FILE)")
    return 0


def _write_table(table: Any, path: str) -> None:
    ext = os.path.splitext(path)[1].lower()
    if ext == ".parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    elif ext == ".csv":
        import pyarrow.csv as pacsv

        pacsv.write_csv(table, path)
    else:
        raise ConfigError("--out", path, "a file name ending in .parquet or .csv")


# -- statistics -------------------------------------------------------------------------------
def history_status(record: CheckpointRecord) -> str:
    """``completed``, ``failed`` or ``aborted`` (see
    :class:`~spark_ckpt.client.pipeline_client.CheckpointSummary`)."""
    from spark_ckpt.runtime.failure import is_aborted

    if record.failure is None:
        return "completed"
    return "aborted" if is_aborted(record.failure) else "failed"


def history_row(record: CheckpointRecord, *, timed: bool = False) -> dict[str, Any]:
    """A record's row of ``stats``; *timed*: with the event-time cells."""
    s = record.figures
    return {
        "id": record.checkpoint_id,
        "status": history_status(record),
        "type": record.snapshot_type.value,
        "ended": when(s.completed_ms),
        **figure_cells(s),
        **(time_cells(s) if timed else {}),
        "reason": record.reason,
    }


def history_json(record: CheckpointRecord) -> dict[str, Any]:
    """One record of ``stats --json``: the same fields for every status; a failed or aborted
    record also carries the failure record's own fields (``checkpoint_id``, ``failed_ms``),
    as ``stats --json`` printed them before the history existed."""
    s = record.figures
    failure = {} if record.failure is None else record.failure.to_dict()
    return {
        **failure,
        "id": record.checkpoint_id,
        "status": history_status(record),
        "type": record.snapshot_type.value,
        "trigger_ms": s.trigger_ms,
        "end_ms": s.completed_ms,
        "duration_ms": s.end_to_end_ms,
        "state_bytes": s.state_bytes,
        "bytes_written": s.bytes_written,
        "channel_state_bytes": s.channel_state_bytes,
        "alignment_ms": s.max_alignment_ms,
        "start_delay_ms": s.max_start_delay_ms,
        "reason": record.reason,
        "message": record.failure.message if record.failure is not None else "",
        "properties": dict(record.properties),
        "task_metrics": {k: m.to_dict() for k, m in sorted(s.task_metrics.items())},
    } | (_time_json(s) if s.task_time else {})


def stats(args: argparse.Namespace) -> int:
    """The checkpoint statistics history: a header counting its records, one row per record
    (completed, failed, aborted), then why the failed and aborted ones failed."""
    c = client(args.root)
    records = c.history()
    if args.json:
        print(json_lines([history_json(r) for r in records]))
    else:
        from spark_ckpt.runtime.failure import is_aborted

        failures = [r.failure for r in records if r.failure is not None]
        aborted = sum(is_aborted(f) for f in failures)
        completed = [r for r in records if r.failure is None]
        savepoints = sum(r.is_savepoint for r in completed)
        print(
            f"{len(records)} checkpoints on record: {len(completed) - savepoints} completed, "
            f"{savepoints} savepoints, {len(failures) - aborted} failed, {aborted} aborted "
            f"({len(c.checkpoints())} retained for restores)"
        )
        timed = any(r.figures.task_time for r in records)
        print(render([history_row(r, timed=timed) for r in records]))
        if failures:
            print("\nwhy they failed")
            print(
                render(
                    [
                        {"id": f.checkpoint_id, "reason": f.reason, "message": f.message}
                        for f in failures
                    ]
                )
            )
    if args.plot:
        from spark_ckpt.client.stats_plot import plot_checkpoint_stats

        plot_checkpoint_stats(c.root, args.plot, client=c)
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


# -- the checkpoint page ----------------------------------------------------------------------
def ui(args: argparse.Namespace) -> int:
    """``ui``: read the root once (a root without a pipeline, or a damaged statistics
    history, ends here in one line), then serve the page until Ctrl-C."""
    from spark_ckpt.monitoring import CheckpointServer, RootReader

    c = client(args.root)
    reader = RootReader(c.root, c.store, args.pipeline)
    view = reader.read()
    if not view.runs and not view.records:
        raise CheckpointNotFoundError(
            f"no run of a pipeline under {c.root} yet: start the pipeline, then the page"
        )
    server = CheckpointServer(reader, args.host, args.port)
    print(f"checkpoint page of {view.pipeline} at {server.url} (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
