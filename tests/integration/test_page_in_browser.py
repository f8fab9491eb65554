"""The checkpoint page of a running pipeline, in a real browser: headless Chromium (Debian's
package, installed by ``make test``) loads what ``spark-ckpt ui`` serves.

The main job runs in a subprocess with the ``store-commit`` fail point armed for one hit (as
in ``test_failure_stats``): its first fully acknowledged checkpoint fails to complete
(``finalize_failed``), later ones complete. ``spark-ckpt ui`` runs as the console script
does; the job runs on classic Spark and under Spark Connect (its source runner, where the
coordinator reports from, in the Connect server). The test reads the DOM Chromium built
after the page's script ran (``--dump-dom``), twice, and saves a screenshot; after the job
stopped, ``/metrics`` and the JSON history are held against the client and ``spark-ckpt
checkpoints list``.

The oracles: the store as the client reads it, and the job's own parallelism."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from spark_ckpt.client.pipeline_client import PipelineClient
from spark_ckpt.testing import faults
from spark_ckpt.testing.jobs import DemoArgs, DemoLauncher

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: Liveness bounds (never assertions about speed).
STEP_TIMEOUT_S = 240.0
BROWSER_TIMEOUT_S = 120.0
SCRIPT = Path(sys.executable).parent / "spark-ckpt"


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "no chromium on PATH (make test installs Debian's package as root)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


class Tables(HTMLParser):
    """The rows of every table with an id: cell texts, and the row's data attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[tuple[dict[str, str], list[str]]]] = {}
        self.body_attrs: dict[str, str] = {}
        self._table: str | None = None
        self._in_body = False
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "body":
            self.body_attrs = a
        elif tag == "table" and "id" in a:
            self._table = a["id"]
            self.tables[self._table] = []
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._table and self._in_body:
            self.tables[self._table].append((a, []))
        elif tag in ("td", "th") and self._table and self._in_body:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._table:
            self.tables[self._table][-1][1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tbody":
            self._in_body = False
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def headless(url: str, profile: Path, *flags: str, budget_ms: int = 8000) -> str:
    """Run headless Chromium on *url* once the page's script ran (Chromium's virtual time:
    timers run as fast as they can, requests to the server are waited for); its stdout."""
    done = subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={budget_ms}",
            *flags,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=BROWSER_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def load(url: str, profile: Path, budget_ms: int = 8000) -> Tables:
    """The DOM of *url* as its script left it."""
    tables = Tables()
    tables.feed(headless(url, profile, "--dump-dom", budget_ms=budget_ms))
    return tables


def screenshot(url: str, profile: Path, directory: Path) -> Path:
    shot = directory / "checkpoint-page.png"
    headless(url, profile, "--window-size=1400,2400", f"--screenshot={shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return shot


def console(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=600, check=False
    )


def start_ui(root: str) -> tuple[subprocess.Popen[str], str]:
    """``spark-ckpt ui`` on a free port, and the page's URL it printed."""
    server = subprocess.Popen(
        [str(SCRIPT), "ui", "--root", root, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    first = server.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:\d+/", first)
    if found is None:
        server.kill()
        raise AssertionError(first + server.communicate(timeout=30)[1])
    return server, found.group(0)


# classic only: the page reads the pipeline's root (its checkpoints, the coordinator's
# heartbeat), which the source runner writes the same under Spark Connect
@pytest.mark.parametrize("remote", [None], ids=["classic"])
def test_the_page_of_a_running_pipeline(tmp_path: Path, remote: str | None) -> None:
    launcher = DemoLauncher(tmp_path)
    args = DemoArgs(
        remote=remote,
        root=tmp_path / "root",
        output=tmp_path / "out",
        pipeline="page",
        backlog="2000",
        rate=200.0,
        channels=2,
        keys=20,
        interval="1s",
        max_rows_per_trigger=200,
        tolerable_failures=3,
        restarts=0,
    )
    root = str(args.root)
    faults.arm(root, faults.Fault.STORE_COMMIT, faults.Action.RAISE, times=1, error="store")
    run = launcher.start(args)
    server: subprocess.Popen[str] | None = None
    try:
        launcher.wait_until(
            run,
            lambda: (
                bool(PipelineClient(root).failures()) and len(PipelineClient(root).history()) >= 3
            ),
            STEP_TIMEOUT_S,
            "a failed checkpoint and two more",
        )
        server, url = start_ui(root)
        client = PipelineClient(root)
        first = load(url + "?refresh=0", tmp_path / "profile-1")
        # the history grows between two loads (the bound is liveness)
        launcher.wait_until(
            run,
            lambda: len(client.history()) > len(first.tables["history"]),
            STEP_TIMEOUT_S,
            "a checkpoint finished after the first load",
        )
        second = load(url + "?refresh=0", tmp_path / "profile-2")

        def ids(t: Tables) -> list[int]:
            return [int(a["data-id"]) for a, _ in t.tables["history"]]

        assert len(ids(second)) > len(ids(first)) and max(ids(second)) > max(ids(first))
        # the failed checkpoint shows its reason
        [failed] = [f for f in client.failures() if f.reason == "finalize_failed"]
        failures = {int(a["data-id"]): " ".join(c) for a, c in second.tables["failures"]}
        assert "finalize_failed" in failures[failed.checkpoint_id], failures
        assert "injected fault store-commit" in failures[failed.checkpoint_id], failures
        # the subtask table shows every subtask (those of every checkpoint of the run)
        detailed = {a["data-subtask"] for a, _ in second.tables["subtasks"]}
        assert detailed == {str(t.task) for t in client.checkpoints()[-1].tasks}
        assert len(detailed) == args.parallelism, detailed
        # the live run's source channels, from its coordinator's heartbeat
        assert len(second.tables["sources"]) == args.channels, second.tables["sources"]
        # it refreshes itself: with refresh=1 s, Chromium's virtual time runs several loads
        refreshing = load(url + "?refresh=1", tmp_path / "profile-3", budget_ms=6000)
        assert int(refreshing.body_attrs.get("data-loaded", "0")) >= 2, refreshing.body_attrs
        # a screenshot, kept with the test's files (and where SPARK_CKPT_ARTIFACTS points)
        shot = screenshot(url + "?refresh=0", tmp_path / "profile-4", tmp_path)
        artifacts = os.environ.get("SPARK_CKPT_ARTIFACTS")
        if artifacts:
            Path(artifacts).mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, Path(artifacts) / shot.name)

        stopped = console("savepoint", "stop", "--root", root, "--timeout", "180", "--json")
        assert stopped.returncode == 0, stopped.stderr + run.tail()
        assert run.wait(120) == 0, run.tail()
        # a run restored from that savepoint: the page says what it came from
        savepoint = json.loads(stopped.stdout)["path"]
        restored = launcher.start(
            replace(args, available_now=True, extra=("--restore-savepoint", savepoint))
        )
        assert restored.wait(STEP_TIMEOUT_S) == 0, restored.tail()
        # stopped: /metrics and the JSON history agree with the client and the CLI
        metrics = urllib.request.urlopen(url + "metrics", timeout=60).read().decode()
        doc = json.loads(urllib.request.urlopen(url + "checkpoints", timeout=60).read())
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        assert launcher.cleanup() == []
    stats = PipelineClient(root).stats()
    retained = PipelineClient(root).checkpoints()
    values = {
        s.name: s.value
        for f in text_string_to_metric_families(metrics)
        for s in f.samples
        if "subtask" not in s.labels and "channel" not in s.labels
    }
    assert values["spark_ckpt_up"] == 0
    last_restore = doc["latest"]["restored"]
    assert last_restore["restored_from"] == f"savepoint {savepoint}", last_restore
    assert doc["counts"]["restored"] == 1 and doc["runs"][0]["restored_from"] is not None
    assert values["spark_ckpt_lastCheckpointRestoreTimestamp"] == last_restore["restore_timestamp"]
    assert last_restore["restore_timestamp"] > 0
    assert values["spark_ckpt_numberOfCompletedCheckpoints"] == stats.checkpoints + stats.savepoints
    assert values["spark_ckpt_numberOfFailedCheckpoints"] == stats.failed + stats.aborted
    assert values["spark_ckpt_lastCompletedCheckpointId"] == retained[-1].checkpoint_id
    assert values["spark_ckpt_lastCheckpointDuration"] == retained[-1].stats.end_to_end_ms
    assert values["spark_ckpt_lastCheckpointFullSize"] == retained[-1].stats.state_bytes
    listed = [
        json.loads(line)
        for line in console("checkpoints", "list", "--root", root, "--json").stdout.splitlines()
    ]
    history = {e["id"]: e for e in doc["history"]}
    assert [r["id"] for r in listed] == [c.checkpoint_id for c in retained]
    for row in listed:
        e = history[row["id"]]
        assert (e["trigger_timestamp"], e["end_to_end_duration"], e["state_size"]) == (
            row["trigger_ms"],
            row["duration_ms"],
            row["state_bytes"],
        )
