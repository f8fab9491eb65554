"""The checkpoint page's server without Spark: a real Delta checkpoint store with completed,
failed and aborted checkpoints, run files and a live coordinator's heartbeat, written here;
the server on a free port of 127.0.0.1, read over HTTP.

The oracles are the records written here (a plain fold over them), the client's own
answers (``client.stats()``, ``client.checkpoints()``), ``spark-ckpt checkpoints list``, and
Prometheus' own text parser."""

from __future__ import annotations

import json
import os
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_cli import assert_one_error_line, cli, lines

from spark_ckpt.client.pipeline_client import PipelineClient
from spark_ckpt.coordination.heartbeats import HeartbeatRole, Heartbeats
from spark_ckpt.coordination.live_report import ChannelProgress, InProgress, LiveReport
from spark_ckpt.coordination.runs import RestorePoint, RunFiles, RunState, RunStatus
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.delta.store_layout import StoreTable
from spark_ckpt.monitoring import CheckpointServer, RootReader
from spark_ckpt.monitoring.charts import duration_chart, size_chart, time_ticks
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint, FailedCheckpoint
from spark_ckpt.protocol.state_handles import ChangeMetrics, CheckpointMetrics
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.testing.damage import data_files

REPO = Path(__file__).resolve().parents[2]
T0 = 1_795_000_000_000  # 2026-11-18T11:06:40Z
SUBTASKS = ("chain#0", "chain#1", "chain#2")
FAILURES = {4: ("expired", "checkpoint expired after 600000 ms"), 6: ("subsumed", "by 7")}
RUNS = ("a" * 32, "b" * 32)


def completed(cid: int, kind: SnapshotType = SnapshotType.CHECKPOINT) -> CompletedCheckpoint:
    metrics = {
        t: CheckpointMetrics(
            sync_ms=i + 1,
            async_ms=10 * cid,
            alignment_ms=cid + i,
            start_delay_ms=2 * i,
            state_bytes=1000 * cid + i,
        )
        for i, t in enumerate(SUBTASKS)
    }
    changes = {
        t: ChangeMetrics(keys_changed=5 * cid + i, in_flight_rows=i, bytes_written=100 * cid)
        for i, t in enumerate(SUBTASKS)
    }
    stats = CheckpointStats(
        T0 + cid * 60_000,
        T0 + cid * 60_000 + 100 + 7 * cid,
        state_bytes=sum(m.state_bytes for m in metrics.values()),
        bytes_written=300 * cid,
        task_metrics=metrics,
        task_changes=changes,
    )
    return CompletedCheckpoint(cid, kind, (), stats, {"pipeline": "orders"})


def write_root(base: str) -> None:
    """Checkpoints 1-3, 5, 7 completed (5 a savepoint), 4 expired, 6 subsumed; two runs (the
    second restored from checkpoint 3 and is live, reporting checkpoint 8 in progress)."""
    store = DeltaCheckpointStore(base)
    lease = store.acquire()
    for cid in range(1, 8):
        if cid in FAILURES:
            reason, message = FAILURES[cid]
            t = T0 + cid * 60_000
            failed = FailedCheckpoint(
                cid,
                SnapshotType.CHECKPOINT,
                t,
                t + 900,
                reason,
                message,
                {SUBTASKS[0]: CheckpointMetrics(sync_ms=1)},
                subtasks=3,
            )
            store.record_failure(lease, failed)
        else:
            kind = SnapshotType.SAVEPOINT if cid == 5 else SnapshotType.CHECKPOINT
            store.commit(lease, completed(cid, kind))
    config = CheckpointConfig(interval_ms=60_000, min_pause_ms=500, retained_checkpoints=5)
    first, second = (RunFiles(base, r) for r in RUNS)
    first.write_restore_point(RestorePoint(None, at_ms=T0))
    first.write_config("orders", config.to_dict())
    first.write_status(
        RunStatus(
            RUNS[0], "d", RunState.FAILED, 1, T0 + 250_000, error="Py4JJavaError: executor lost"
        )
    )
    second.write_restore_point(RestorePoint(3, at_ms=T0 + 260_000))
    second.write_config("orders", config.to_dict())
    second.write_status(RunStatus(RUNS[1], "d", RunState.RUNNING, 2, T0 + 260_000, 3))
    report = LiveReport(
        RUNS[1],
        T0 + 500_000,
        (InProgress(8, SnapshotType.CHECKPOINT, T0 + 480_000, 1, 3),),
        (ChannelProgress(0, 100, 250, 400), ChannelProgress(1, 0, 70, 70)),
    )
    Heartbeats(base).beat(RUNS[1], HeartbeatRole.COORDINATOR, 3_600_000, report)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("page") / "orders"
    write_root(str(base))
    return base


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[CheckpointServer]:
    s = CheckpointServer(RootReader(str(root), DeltaCheckpointStore(str(root))), port=0)
    s.serve_in_thread()
    yield s
    s.shutdown()
    s.server_close()


def get(server: CheckpointServer, path: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(server.url.rstrip("/") + path, timeout=30) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def get_json(server: CheckpointServer, path: str) -> Any:
    status, kind, body = get(server, path)
    assert status == 200 and kind == "application/json", (status, body)
    return json.loads(body)


def test_the_server_listens_on_this_machine_only_by_default(server: CheckpointServer) -> None:
    assert server.url.startswith("http://127.0.0.1:")


def test_checkpoints_has_flinks_counts_latest_and_history(server: CheckpointServer) -> None:
    doc = get_json(server, "/checkpoints")
    assert doc["pipeline"] == "orders" and doc["running"] is True
    assert doc["counts"] == {
        "restored": 1,
        "total": 8,
        "in_progress": 1,
        "completed": 5,
        "savepoints": 1,
        "failed": 2,
        "aborted": 1,
    }
    history = doc["history"]
    assert [e["id"] for e in history] == [8, 7, 6, 5, 4, 3, 2, 1]
    assert [e["status"] for e in history] == [
        "IN_PROGRESS",
        "COMPLETED",
        "FAILED",
        "COMPLETED",
        "FAILED",
        "COMPLETED",
        "COMPLETED",
        "COMPLETED",
    ]
    by_id = {e["id"]: e for e in history}
    assert by_id[8]["num_acknowledged_subtasks"] == 1 and by_id[8]["num_subtasks"] == 3
    assert by_id[4]["failure_reason"] == "expired" and by_id[4]["outcome"] == "failed"
    assert by_id[6]["outcome"] == "aborted" and by_id[6]["num_subtasks"] == 3
    assert by_id[4]["failure_message"] == FAILURES[4][1]
    for cid in (1, 2, 3, 5, 7):
        e = by_id[cid]
        assert e["end_to_end_duration"] == 100 + 7 * cid
        assert e["checkpointed_size"] == 300 * cid
        assert e["state_size"] == sum(1000 * cid + i for i in range(3))
        assert e["alignment_duration"] == cid + 2
        assert e["keys_changed"] == sum(5 * cid + i for i in range(3))
        assert e["in_flight_rows"] == 0 + 1 + 2
        assert e["num_subtasks"] == e["num_acknowledged_subtasks"] == 3
    assert doc["latest"]["completed"]["id"] == 7
    assert doc["latest"]["savepoint"]["id"] == 5
    assert doc["latest"]["failed"]["id"] == 6
    assert doc["latest"]["restored"] == {
        "id": 3,
        "restore_timestamp": T0 + 260_000,
        "is_savepoint": False,
        "restored_from": None,
        "run_id": RUNS[1],
        "attempt": 2,
    }
    durations = sorted(100 + 7 * c for c in (1, 2, 3, 5, 7))
    summary = doc["summary"]["end_to_end_duration"]
    assert (summary["min"], summary["max"], summary["p50"]) == (
        durations[0],
        durations[-1],
        durations[2],
    )
    assert summary["avg"] == pytest.approx(sum(durations) / 5)
    assert [r["run_id"] for r in doc["runs"]] == [RUNS[1], RUNS[0]]
    assert doc["runs"][1]["error"] == "Py4JJavaError: executor lost"
    assert [(s["channel"], s["pending"]) for s in doc["sources"]] == [(0, 150), (1, 0)]


def test_details_list_every_subtask(server: CheckpointServer) -> None:
    d = get_json(server, "/checkpoints/details/7")
    assert [s["subtask"] for s in d["subtasks"]] == list(SUBTASKS)
    for i, s in enumerate(d["subtasks"]):
        assert s["checkpoint"] == {"sync": i + 1, "async": 70}
        assert s["alignment"]["duration"] == 7 + i and s["start_delay"] == 2 * i
        assert (s["keys_changed"], s["in_flight_rows"], s["checkpointed_size"]) == (35 + i, i, 700)
    failed = get_json(server, "/checkpoints/details/4")
    assert failed["failure_reason"] == "expired" and len(failed["subtasks"]) == 1
    assert get(server, "/checkpoints/details/99")[0] == 404


def test_config_in_flinks_keys(server: CheckpointServer) -> None:
    c = get_json(server, "/checkpoints/config")
    assert c["mode"] == "exactly_once" and c["alignment"] == "aligned"
    assert (c["interval"], c["min_pause"], c["max_concurrent"]) == (60_000, 500, 1)
    assert c["retained_checkpoints"] == 5 and c["timeout"] == 600_000
    assert c["externalization"] == {"enabled": True, "delete_on_cancellation": False}


def metric_values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_parse_and_agree_with_the_client(server: CheckpointServer, root: Path) -> None:
    status, kind, body = get(server, "/metrics")
    assert status == 200 and kind.startswith("text/plain; version=0.0.4")
    values = metric_values(body.decode())
    labels = (("pipeline", "orders"), ("run", RUNS[1]))

    def value(name: str, **extra: str) -> float:
        return values[("spark_ckpt_" + name, tuple(sorted(labels + tuple(extra.items()))))]

    client = PipelineClient(str(root))
    stats = client.stats()
    latest = client.checkpoints()[-1]
    assert value("numberOfCompletedCheckpoints") == stats.checkpoints + stats.savepoints
    assert value("numberOfFailedCheckpoints") == stats.failed + stats.aborted
    assert value("numberOfAbortedCheckpoints") == stats.aborted
    assert value("numberOfInProgressCheckpoints") == 1
    assert value("lastCheckpointDuration") == latest.stats.end_to_end_ms
    assert value("lastCheckpointSize") == latest.stats.bytes_written
    assert value("lastCheckpointFullSize") == latest.stats.state_bytes
    assert value("lastCompletedCheckpointId") == latest.checkpoint_id
    assert value("lastCheckpointRestoreTimestamp") == T0 + 260_000
    assert value("lastCheckpointAlignmentTime") == latest.stats.max_alignment_ms
    for t, m in latest.stats.task_metrics.items():
        assert value("checkpointAlignmentTime", subtask=t) == m.alignment_ms
    assert value("numRestarts") == 1
    assert value("numRecordsIn", channel="0") == 150 and value("pendingRecords", channel="1") == 0
    assert value("up") == 1


def test_the_json_history_agrees_with_checkpoints_list(
    server: CheckpointServer, root: Path
) -> None:
    listed = lines(cli("checkpoints", "list", "--root", str(root), "--json").stdout)
    history = {e["id"]: e for e in get_json(server, "/checkpoints")["history"]}
    assert listed, "checkpoints list printed nothing"
    for row in listed:
        e = history[row["id"]]
        assert e["status"] == "COMPLETED" and not e["discarded"]
        assert e["checkpoint_type"].lower().endswith(row["type"])
        assert (e["trigger_timestamp"], e["latest_ack_timestamp"]) == (
            row["trigger_ms"],
            row["completed_ms"],
        )
        assert (e["end_to_end_duration"], e["state_size"], e["checkpointed_size"]) == (
            row["duration_ms"],
            row["state_bytes"],
            row["bytes_written"],
        )
        assert e["alignment_duration"] == row["alignment_ms"]


def test_the_page_and_its_files_are_served_offline(server: CheckpointServer) -> None:
    status, kind, body = get(server, "/")
    assert status == 200 and kind.startswith("text/html")
    page = body.decode()
    assert 'src="/static/page.js"' in page and "http" not in page.replace("http-equiv", "")
    script = get(server, "/static/page.js")[2].decode()
    assert "fetch(" in script and "https://" not in script and "http://" not in script
    for chart in ("/charts/duration.svg", "/charts/size.svg"):
        status, kind, svg = get(server, chart)
        assert status == 200 and kind == "image/svg+xml" and svg.startswith(b"<svg")
    assert get(server, "/nothing")[0] == 404


def test_the_notebook_view_has_counts_history_and_charts(root: Path) -> None:
    html = PipelineClient(str(root))._repr_html_()
    assert "Checkpoints of orders (running)" in html
    assert html.count("<svg") == 2 and "expired" in html and "<script" not in html


def test_time_axes_tick_at_whole_readable_steps() -> None:
    ticks = time_ticks(T0, T0 + 5 * 60_000)
    assert [label for _, label in ticks] == ["Nov 18 11:07", "11:08", "11:09", "11:10", "11:11"]
    assert all(t % 60_000 == 0 for t, _ in ticks)
    seconds = time_ticks(T0 + 500, T0 + 20_000)
    assert all(t % 5_000 == 0 for t, _ in seconds) and seconds[1][1] == "11:06:50"


def test_charts_start_at_zero_and_mark_failures(root: Path) -> None:
    records = PipelineClient(str(root)).history()
    svg = duration_chart(records)
    assert svg.count("<title>#4 900 ms expired</title>") == 1
    assert ">0</text>" in svg and ">ms</text>" in svg
    assert "KiB" in size_chart(records) or "B</text>" in size_chart(records)
    assert "no checkpoints yet" in duration_chart([])


def test_ui_without_a_pipeline_root_is_one_line(tmp_path: Path) -> None:
    done = cli("ui", "--root", str(tmp_path / "nothing"), "--port", "0")
    assert_one_error_line(done, "no pipeline root at")


def test_ui_of_a_root_no_run_wrote_is_one_line(tmp_path: Path) -> None:
    DeltaCheckpointStore(str(tmp_path / "fresh")).acquire()
    done = cli("ui", "--root", str(tmp_path / "fresh"), "--port", "0")
    assert_one_error_line(done, "no run of a pipeline under")


def test_ui_with_a_damaged_statistics_table_is_one_line(root: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "damaged"
    shutil.copytree(root, copy)
    [victim, *_] = data_files(copy, StoreTable.HISTORY)
    victim.write_bytes(victim.read_bytes()[: os.path.getsize(victim) // 2])
    done = cli("ui", "--root", str(copy), "--port", "0")
    assert_one_error_line(done, str(copy))


def test_ui_on_a_port_in_use_is_one_line(root: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli("ui", "--root", str(root), "--port", str(port))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: port {port} on 127.0.0.1 is in use"), done.stderr


@pytest.mark.parametrize("port", ["99999", "http", "-1"])
def test_ui_with_a_bad_port_is_one_line(root: Path, port: str) -> None:
    done = cli("ui", "--root", str(root), "--port", port)
    assert done.returncode == 2 and done.stderr.splitlines()[-1].startswith("error: argument")
    assert "is not a port" in done.stderr and "Traceback" not in done.stderr


def test_a_heartbeat_report_survives_its_json_and_unknown_fields() -> None:
    report = LiveReport(
        "r",
        5,
        (InProgress(3, SnapshotType.SAVEPOINT, 1, 2, 4),),
        (ChannelProgress(0, 1, 9, 12),),
    )
    d = json.loads(json.dumps(report.to_dict()))
    d["from_a_newer_version"] = {"x": 1}
    assert LiveReport.from_dict(d) == report
    assert report.channels[0].pending == 3 and report.channels[0].read == 8


def test_the_grafana_dashboard_reads_metrics_the_server_exposes(server: CheckpointServer) -> None:
    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    exposed = {
        s.name
        for f in text_string_to_metric_families(get(server, "/metrics")[2].decode())
        for s in f.samples
    }
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queried = {name for e in exprs for name in re.findall(r"spark_ckpt_\w+", e)}
    assert queried and queried <= exposed, queried - exposed
    assert all('pipeline="$pipeline"' in e for e in exprs)
    variable = dashboard["templating"]["list"][1]["query"]
    assert re.findall(r"spark_ckpt_\w+", variable)[0] in exposed


BUCKET = "checkpoint-page"


def test_the_page_of_a_root_on_an_object_store(on_s3: Any) -> None:
    root = f"s3://{BUCKET}/orders"
    write_root(root)
    server = PipelineClient(root).serve(port=0)
    try:
        doc = get_json(server, "/checkpoints")
        assert doc["counts"]["completed"] == 5 and doc["counts"]["in_progress"] == 1
        assert doc["latest"]["failed"]["failure_reason"] == "subsumed"
        assert len(get_json(server, "/checkpoints/details/7")["subtasks"]) == len(SUBTASKS)
        values = metric_values(get(server, "/metrics")[2].decode())
        assert (
            values[
                ("spark_ckpt_numberOfFailedCheckpoints", (("pipeline", "orders"), ("run", RUNS[1])))
            ]
            == 2
        )
    finally:
        server.shutdown()
        server.server_close()


def test_a_reader_reads_the_files_of_an_ended_run_once(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = RootReader(str(root), DeltaCheckpointStore(str(root)))
    first = reader.read()
    read: list[str] = []
    status = RunFiles.status

    def counted(self: RunFiles) -> RunStatus | None:
        read.append(self.run_id)
        return status(self)

    monkeypatch.setattr(RunFiles, "status", counted)
    again = reader.read()
    assert read == [RUNS[1]]  # the running one; RUNS[0] failed, its files are known
    assert again.runs == first.runs
