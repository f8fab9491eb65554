"""``spark-ckpt`` on a pipeline root and savepoint directory built without Spark (real Delta
tables). Oracles are the values the test wrote.

Most commands run through :func:`spark_ckpt.cli.main` in this process, with its output
captured, exactly as the console script runs it (``sys.exit(main())``): a new interpreter
per command would import the package every time. The console script itself, ``python -m``
and what only a process shows (usage errors from argparse, the debug traceback, a missing
optional dependency, Spark stopped after a failed demo) run in subprocesses: :func:`console`.

The request commands (``checkpoint``, ``savepoint trigger|stop``, ``stop``) need a running
pipeline: tests/integration (test_faults, test_savepoints) drive them against real jobs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_ckpt.cli import DEBUG_ENV, main
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.delta.savepoint import export_savepoint
from spark_ckpt.delta.store_layout import StoreTable
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.state_handles import CheckpointMetrics, SourceOffset
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.descriptor import ValueStateDescriptor
from spark_ckpt.state.keygroup import key_group_indices, subtask_for_key_group
from spark_ckpt.testing.damage import data_files
from spark_ckpt.testing.jvm import jvm_options
from spark_ckpt.testing.processes import kill_session, session_processes

COUNT = ValueStateDescriptor("count", pa.int64())
ORACLE = {k: 10 * k + 1 for k in range(40)}


def key_group(key: int) -> int:
    return int(key_group_indices(pa.array([key], pa.int64()), 128)[0])


def console(*args: str) -> subprocess.CompletedProcess[str]:
    """``spark-ckpt *args`` through the installed console script, in a process of its own."""
    script = Path(sys.executable).parent / "spark-ckpt"
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, timeout=300, check=False
    )


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``spark-ckpt *args`` as the console script runs it, in this process: ``main``'s exit
    status (or ``SystemExit``'s, for ``--help``) and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(args))
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else int(e.code is not None)
    return subprocess.CompletedProcess(
        ["spark-ckpt", *args], status, out.getvalue(), err.getvalue()
    )


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Checkpoints 1..3 of operator 'counter' (2 subtasks); 3 is a savepoint, exported."""
    base = tmp_path_factory.mktemp("cli")
    store = DeltaCheckpointStore(str(base / "root"))
    lease = store.acquire()
    backends = [KeyedStateBackend.for_subtask("counter", i, 2, pa.int64(), 128) for i in range(2)]
    for i, b in enumerate(backends):
        mine = [k for k in ORACLE if subtask_for_key_group(128, 2, key_group(k)) == i]
        b.put_values(
            COUNT, pa.array(mine, pa.int64()), pa.array([ORACLE[k] for k in mine], pa.int64())
        )
    for n in range(3):
        cid = lease.first_id + n
        handles = []
        for b in backends:
            snap = b.snapshots.snapshot(cid, full=True)
            offsets = (SourceOffset("source", 0, 100 * (n + 1)), SourceOffset("source", 1, 7))
            snap = type(snap)(snap.task, snap.new_blobs, snap.reused, offsets)
            handles.append(store.write_task_state(cid, snap))
        metrics = {
            str(h.task): CheckpointMetrics(3, 40 + n, 5, 2, h.state_bytes()) for h in handles
        }
        kind = SnapshotType.SAVEPOINT if n == 2 else SnapshotType.CHECKPOINT
        cp = CompletedCheckpoint(
            cid,
            kind,
            tuple(sorted(handles, key=lambda h: h.task)),
            CheckpointStats(
                1_000_000 * (n + 1), 1_000_000 * (n + 1) + 50 + n, 100, 100, 0, metrics
            ),
            {"pipeline": "counts"},
        )
        store.commit(lease, cp)
        for b, h in zip(backends, handles, strict=True):
            b.snapshots.notify_checkpoint_complete(cid, h)
    export_savepoint(store, cp, str(base / "savepoints"), pipeline="counts", max_parallelism=128)
    return base / "root"


def lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def assert_one_error_line(done: subprocess.CompletedProcess[str], text: str) -> None:
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    assert text in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_checkpoints_list_as_a_table_and_as_json(root: Path) -> None:
    table = cli("checkpoints", "list", "--root", str(root))
    assert table.returncode == 0, table.stderr
    header, rule, *rows = table.stdout.splitlines()
    assert header.split()[:3] == ["id", "type", "completed"] and set(rule) <= {"-", " "}
    assert [r.split()[1] for r in rows] == ["checkpoint", "checkpoint", "savepoint"]
    js = lines(cli("checkpoints", "list", "--root", str(root), "--json").stdout)
    assert [r["type"] for r in js] == ["checkpoint", "checkpoint", "savepoint"]
    assert [r["duration_ms"] for r in js] == [50, 51, 52]
    assert js[0]["offsets"] == {"source/0": 100, "source/1": 7}


def test_checkpoints_show_has_subtasks_state_and_positions(root: Path) -> None:
    first = lines(cli("checkpoints", "list", "--root", str(root), "--json").stdout)[0]["id"]
    shown = cli("checkpoints", "show", str(first), "--root", str(root))
    assert shown.returncode == 0, shown.stderr
    for part in ("subtasks", "counter#0", "counter#1", "state", "count", "source positions"):
        assert part in shown.stdout, shown.stdout
    [detail] = lines(cli("checkpoints", "show", str(first), "--root", str(root), "--json").stdout)
    assert {t["task"] for t in detail["tasks"]} == {"counter#0", "counter#1"}
    assert all(t["async_ms"] == 40 for t in detail["tasks"])
    assert sum(b["rows"] for b in detail["blobs"]) == len(ORACLE)


def test_state_read_prints_writes_parquet_and_csv(root: Path, tmp_path: Path) -> None:
    listed = lines(cli("state", "read", "--path", str(root), "--json").stdout)
    assert {"uid": "counter", "state": "count", "kind": "value"} in listed
    rows = lines(
        cli(
            "state",
            "read",
            "--path",
            str(root),
            "--uid",
            "counter",
            "--state",
            "count",
            "--json",
            "--limit",
            "0",
        ).stdout
    )
    assert {r["key"]: r["value"] for r in rows} == ORACLE
    out = tmp_path / "count.parquet"
    done = cli(
        "state",
        "read",
        "--path",
        str(root),
        "--uid",
        "counter",
        "--state",
        "count",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    table = pq.read_table(out)
    assert dict(zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True)) == ORACLE
    csv = tmp_path / "count.csv"
    assert (
        cli(
            "state",
            "read",
            "--path",
            str(root),
            "--uid",
            "counter",
            "--state",
            "count",
            "--out",
            str(csv),
        ).returncode
        == 0
    )
    assert csv.read_text().splitlines()[0].replace('"', "") == "key,value"


def test_savepoint_list_and_dispose(root: Path) -> None:
    directory = root.parent / "savepoints"
    [sp] = lines(cli("savepoint", "list", "--dir", str(directory), "--json").stdout)
    assert sp["pipeline"] == "counts" and Path(str(sp["path"])).is_dir()
    read = lines(
        cli(
            "state",
            "read",
            "--path",
            str(sp["path"]),
            "--uid",
            "counter",
            "--state",
            "count",
            "--json",
            "--limit",
            "0",
        ).stdout
    )
    assert {r["key"]: r["value"] for r in read} == ORACLE
    not_savepoint = cli("savepoint", "dispose", str(root))
    assert_one_error_line(not_savepoint, "not a savepoint directory")
    assert root.is_dir()
    done = cli("savepoint", "dispose", str(sp["path"]), "--json")
    assert done.returncode == 0, done.stderr
    assert not Path(str(sp["path"])).exists()
    assert cli("savepoint", "list", "--dir", str(directory)).stdout.strip() == "(none)"


def test_stats_prints_a_summary_and_draws_the_plot(root: Path, tmp_path: Path) -> None:
    plot = tmp_path / "stats.png"
    done = cli("stats", "--root", str(root), "--plot", str(plot))
    assert done.returncode == 0, done.stderr
    # a root without a history table (as the previous version wrote): the log is the history
    header = "3 checkpoints on record: 2 completed, 1 savepoints, 0 failed, 0 aborted"
    assert done.stdout.startswith(header), done.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    js = lines(cli("stats", "--root", str(root), "--json").stdout)
    assert [r["status"] for r in js] == ["completed"] * 3
    assert [r["type"] for r in js] == ["checkpoint", "checkpoint", "savepoint"]


def _table_rows(stdout: str) -> list[str]:
    """The data rows of the first table ``render`` printed (after the header line and
    the column header and rule)."""
    body = stdout.split("\n\n")[0].splitlines()[3:]
    return [line for line in body if line.strip()]


def test_stats_show_the_history_beyond_retention_and_within_its_bound(tmp_path: Path) -> None:
    """Eight checkpoints completed with one retained, two failed, one aborted: ``stats``
    lists every one (its count equals its rows), and with a bound of 5 only the newest 5."""
    from spark_ckpt.protocol.checkpoint import FailedCheckpoint

    root = tmp_path / "root"
    store = DeltaCheckpointStore(str(root))
    lease = store.acquire()
    finished: dict[int, str] = {}  # the oracle: id -> status, as the test made them
    for n in range(11):
        cid = lease.first_id + n
        if n in (3, 7, 9):
            reason = "subsumed" if n == 9 else "expired"
            store.record_failure(
                lease, FailedCheckpoint(cid, SnapshotType.CHECKPOINT, 10 * n, 10 * n + 4, reason)
            )
            finished[cid] = "aborted" if n == 9 else "failed"
            continue
        cp = CompletedCheckpoint(
            cid, SnapshotType.CHECKPOINT, (), CheckpointStats(10 * n, 10 * n + 3)
        )
        store.commit(lease, cp)
        store.retain(lease, 1)
        finished[cid] = "completed"
    assert len(store.list_completed()) == 1
    done = cli("stats", "--root", str(root))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "11 checkpoints on record: 8 completed, 0 savepoints, 2 failed, 1 aborted "
        "(1 retained for restores)"
    ), done.stdout
    rows = _table_rows(done.stdout)
    assert len(rows) == 11
    assert [int(r.split()[0]) for r in rows] == sorted(finished)
    js = lines(cli("stats", "--root", str(root), "--json").stdout)
    assert [(r["id"], r["status"]) for r in js] == sorted(finished.items())
    assert [r["duration_ms"] for r in js] == [
        4 if finished[i] != "completed" else 3 for i in sorted(finished)
    ]
    # the bound: one more write with history_size 5 keeps the newest five
    store.retain(lease, 1, history_size=5)
    js = lines(cli("stats", "--root", str(root), "--json").stdout)
    assert [r["id"] for r in js] == sorted(finished)[-5:]
    done = cli("stats", "--root", str(root))
    assert done.stdout.startswith("5 checkpoints on record"), done.stdout
    assert len(_table_rows(done.stdout)) == 5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("checkpoints", "list", "--root", "/nonexistent/root"), "no pipeline root at"),
        (("stats", "--root", "/nonexistent/root"), "no pipeline root at"),
        (("checkpoints", "show", "999999", "--root", "ROOT"), "no completed checkpoint 999999"),
        (("state", "read", "--path", "ROOT", "--checkpoint", "999999"), "999999"),
        (("state", "read", "--path", "ROOT", "--uid", "nobody", "--state", "count"), "nobody"),
        (
            (
                "state",
                "read",
                "--path",
                "ROOT",
                "--uid",
                "counter",
                "--state",
                "count",
                "--out",
                "x.txt",
            ),
            ".parquet or .csv",
        ),
        (("stats", "--root", "ROOT", "--plot", "x.gif"), ".png"),
        (("savepoint", "list", "--dir", "/nonexistent/sp"), "no savepoint directory"),
        (("savepoint", "dispose", "/nonexistent/sp"), "does not exist"),
        (("demo", "--restore-as-of", "yesterday"), "ISO-8601"),
    ],
)
def test_bad_input_gives_one_clear_line(root: Path, args: tuple[str, ...], message: str) -> None:
    done = cli(*(str(root) if a == "ROOT" else a for a in args))
    assert_one_error_line(done, message)


@pytest.mark.parametrize(
    "command",
    [
        (),
        ("checkpoints", "list"),
        ("checkpoints", "show"),
        ("checkpoints", "pause"),
        ("checkpoints", "resume"),
        ("checkpoint",),
        ("savepoint", "trigger"),
        ("savepoint", "stop"),
        ("savepoint", "list"),
        ("savepoint", "dispose"),
        ("stop",),
        ("state", "read"),
        ("stats",),
        ("demo",),
    ],
)
def test_every_command_has_help(command: tuple[str, ...]) -> None:
    done = cli(*command, "--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: spark-ckpt"), done


def test_python_dash_m_runs_the_same_command_line(root: Path) -> None:
    """``python -m spark_ckpt.cli``, the console script and ``main`` print the same."""
    done = subprocess.run(
        [sys.executable, "-m", "spark_ckpt.cli", "checkpoints", "list", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    script = console("checkpoints", "list", "--root", str(root))
    assert done.returncode == script.returncode == 0, done.stderr + script.stderr
    assert done.stdout == script.stdout == cli("checkpoints", "list", "--root", str(root)).stdout


def test_dispose_never_deletes_a_pipeline_root_holding_one_savepoint(tmp_path: Path) -> None:
    """A root whose only checkpoint is a savepoint looks like a savepoint directory but is
    not one (no export format, a mailbox): dispose refuses it."""
    store = DeltaCheckpointStore(str(tmp_path / "root"))
    lease = store.acquire()
    cp = CompletedCheckpoint(
        lease.first_id, SnapshotType.SAVEPOINT, (), CheckpointStats(1, 2), {"pipeline": "p"}
    )
    store.commit(lease, cp)
    (tmp_path / "root" / "_mailbox").mkdir()
    assert_one_error_line(cli("savepoint", "dispose", str(tmp_path / "root")), "not a savepoint")
    assert (tmp_path / "root" / "checkpoints").is_dir()
    (tmp_path / "root" / "_mailbox").rmdir()  # even without the marker: no export format
    assert_one_error_line(cli("savepoint", "dispose", str(tmp_path / "root")), "not a savepoint")
    assert (tmp_path / "root" / "checkpoints").is_dir()


# -- failures: one line, no trace, Spark stopped ------------------------------------------------


def cut_in_half(path: Path) -> None:
    """A copy that stopped half-way: the file keeps its name, loses its second half."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def assert_failed_in_one_line(done: subprocess.CompletedProcess[str], *texts: str) -> None:
    """Non-zero exit; stderr's last non-empty line is the one ``error:`` line and carries
    *texts*; no traceback anywhere."""
    assert done.returncode != 0, done
    lines_ = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines_ and lines_[-1].startswith("error: "), done.stderr
    assert sum(line.startswith("error:") for line in lines_) == 1, done.stderr
    for text in texts:
        assert text in lines_[-1], lines_[-1]
    assert "Traceback" not in done.stderr + done.stdout, done.stderr


def savepoint_copy(root: Path, directory: Path) -> Path:
    """The root's savepoint exported again, into *directory* (the fixture's own savepoint
    may have been disposed by another test)."""
    store = DeltaCheckpointStore(str(root))
    savepoint = store.latest_completed()
    assert savepoint is not None and savepoint.is_savepoint
    exported = export_savepoint(
        store, savepoint, str(directory), pipeline="counts", max_parallelism=128
    )
    return Path(exported.path)


@pytest.fixture
def damaged_root(root: Path, tmp_path: Path) -> Path:
    """A copy of the pipeline root with a data file of its ``checkpoints`` table cut."""
    copy = tmp_path / "damaged-root"
    shutil.copytree(root, copy)
    cut_in_half(data_files(copy, StoreTable.CHECKPOINTS)[0])
    return copy


@pytest.mark.parametrize(
    "args",
    [
        ("checkpoints", "list", "--root", "ROOT"),
        ("checkpoints", "show", "1", "--root", "ROOT"),
        ("stats", "--root", "ROOT"),
        ("state", "read", "--path", "ROOT"),
    ],
)
def test_a_damaged_root_gives_one_line_naming_it(damaged_root: Path, args: tuple[str, ...]) -> None:
    done = cli(*(str(damaged_root) if a == "ROOT" else a for a in args))
    assert_one_error_line(done, str(damaged_root))
    assert "unreadable data file" in done.stderr


@pytest.mark.parametrize("table", [StoreTable.CHECKPOINTS, StoreTable.OPERATOR_STATE])
def test_a_damaged_savepoint_gives_one_line_naming_it(
    root: Path, tmp_path: Path, table: StoreTable
) -> None:
    copy = savepoint_copy(root, tmp_path)
    cut_in_half(data_files(copy, table)[0])
    read = ("state", "read", "--path", str(copy), "--uid", "counter", "--state", "count")
    assert_one_error_line(cli(*read), str(copy))
    if table is StoreTable.CHECKPOINTS:  # listed first: dispose cannot tell it is a savepoint
        assert_one_error_line(cli("savepoint", "dispose", str(copy)), str(copy))


def test_usage_errors_end_in_one_error_line() -> None:
    for args in (("checkpoints", "list"), ("stats", "--root"), ("nothing",), ("demo", "--bogus")):
        done = console(*args)
        assert done.returncode == 2, done
        assert_failed_in_one_line(done)


def test_an_unexpected_error_is_one_line_naming_its_type(root: Path, tmp_path: Path) -> None:
    """Writing to a directory that does not exist fails in pyarrow (no error of ours)."""
    out = tmp_path / "missing" / "x.parquet"
    args = ("state", "read", "--path", str(root), "--uid", "counter", "--state", "count")
    done = console(*args, "--out", str(out))
    assert done.returncode == 1
    assert_failed_in_one_line(done, "FileNotFoundError", str(out))
    debug = subprocess.run(
        [str(Path(sys.executable).parent / "spark-ckpt"), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, DEBUG_ENV: "1"},
    )
    assert debug.returncode == 1 and "Traceback" in debug.stderr, debug.stderr
    assert debug.stderr.splitlines()[-1] == done.stderr.splitlines()[-1]


@pytest.mark.spark  # the demo starts Spark before it restores
@pytest.mark.parametrize(
    ("table", "cause"),
    [(StoreTable.CHECKPOINTS, "unreadable data file"), (StoreTable.OPERATOR_STATE, "not decode")],
)
def test_demo_restoring_a_damaged_savepoint_fails_in_one_line_and_stops_spark(
    root: Path, tmp_path: Path, table: StoreTable, cause: str
) -> None:
    """The demo (Spark in a session of its own) ends in one line naming the savepoint
    directory, no traceback, and leaves no process behind (JVM, Python workers)."""
    copy = savepoint_copy(root, tmp_path)
    cut_in_half(data_files(copy, table)[0])
    args = ["--pipeline", "counts", "--root", str(tmp_path / "run"), "--channels", "2"]
    args += ["--seconds", "600", "--restore-savepoint", str(copy)]
    popen = subprocess.Popen(
        [str(Path(sys.executable).parent / "spark-ckpt"), "demo", *args],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "JAVA_TOOL_OPTIONS": jvm_options()},
    )
    try:
        stdout, stderr = popen.communicate(timeout=300)
        done = subprocess.CompletedProcess(popen.args, popen.returncode, stdout, stderr)
        assert_failed_in_one_line(done, str(copy), cause)
        deadline = time.monotonic() + 60  # a liveness bound: the JVM exits after its driver
        while session_processes(popen.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert session_processes(popen.pid) == [], "processes left behind by the demo"
    finally:
        if popen.poll() is None:
            popen.kill()
        kill_session(popen.pid)


@pytest.mark.parametrize(
    "request_args", [("checkpoint",), ("savepoint", "trigger"), ("savepoint", "stop"), ("stop",)]
)
def test_a_request_where_nothing_runs_fails_at_once_and_writes_nothing(
    root: Path, tmp_path: Path, request_args: tuple[str, ...]
) -> None:
    """No root at all, and the module's root (a store, no run of it live): the request fails
    at once (its hour-long timeout is never waited for) and no mailbox file is written."""
    for where in (tmp_path / "nowhere", root):
        done = cli(*request_args, "--root", str(where), "--timeout", "3600")
        assert done.returncode == 1, done
        assert_failed_in_one_line(done, "no live run", str(where))
        assert not (where / "_mailbox").exists()
    assert not (tmp_path / "nowhere").exists()


def test_stats_plot_without_matplotlib_ends_in_one_error_line(root: Path, tmp_path: Path) -> None:
    # matplotlib is an optional extra: a CLI without it says which one to install
    blocked = (
        "import sys; sys.modules['matplotlib'] = None; from spark_ckpt.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", blocked, "stats", "--root", str(root), "--plot", "s.png"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert_one_error_line(done, "pip install 'spark-ckpt[plot]'")
    assert not (tmp_path / "s.png").exists()
