"""Requests through the installed ``spark-ckpt`` (checkpoint, checkpoints pause|resume,
savepoint trigger|stop, stop) need a live run: answered while the demo job runs, refused at
once — one ``error:`` line, exit status 1, nothing posted to the mailbox — once it stopped,
and once it was killed (SIGKILL, no chance to clean up: its stale status says ``running``).
Timeouts are set to an hour: a refusal that waited for them would hang the test."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_ckpt.coordination.mailbox import MAILBOX_DIR
from spark_ckpt.coordination.runs import Runs, RunState
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.testing.jobs import DemoArgs, DemoLauncher, DemoRun

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REQUESTS = (
    ("checkpoint",),
    ("checkpoints", "pause"),
    ("checkpoints", "resume"),
    ("savepoint", "trigger"),
    ("savepoint", "stop"),
    ("stop",),
)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "spark-ckpt"
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, timeout=600, check=False
    )


def mailbox_files(root: Path) -> list[str]:
    box = root / MAILBOX_DIR
    return sorted(p.name for p in box.iterdir() if p.is_file()) if box.is_dir() else []


def latest_id(root: Path) -> int:
    if not (root / "checkpoints").exists():
        return 0
    latest = DeltaCheckpointStore(str(root)).latest_completed()
    return latest.checkpoint_id if latest else 0


def assert_refused(root: Path) -> None:
    """Every request fails at once naming the root, and posts nothing."""
    before = mailbox_files(root)
    for request in REQUESTS:
        done = cli(*request, "--root", str(root), "--timeout", "3600")
        assert done.returncode == 1, (request, done)
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
        assert "no live run" in done.stderr and str(root) in done.stderr, done.stderr
        assert "Traceback" not in done.stderr + done.stdout
        assert mailbox_files(root) == before, request


def assert_paused_and_resumed(demo: DemoLauncher, run: DemoRun, root: Path) -> None:
    """``checkpoints pause``: no periodic checkpoint is triggered while paused (the demo's
    interval is 300 ms), a manual one still is; ``checkpoints resume``: periodic ones again."""
    paused = cli("checkpoints", "pause", "--root", str(root), "--timeout", "600")
    assert paused.returncode == 0, paused.stderr + run.tail()
    assert "paused" in paused.stdout, paused.stdout
    assert cli("checkpoint", "--root", str(root), "--timeout", "600").returncode == 0
    first = latest_id(root)
    time.sleep(3)  # ten intervals: room for periodic checkpoints, were they not paused
    assert cli("checkpoint", "--root", str(root), "--timeout", "600").returncode == 0
    assert latest_id(root) == first + 1  # nothing triggered between the two manual ones
    resumed = cli("checkpoints", "resume", "--root", str(root), "--timeout", "600")
    assert resumed.returncode == 0 and "running" in resumed.stdout, resumed.stderr
    demo.wait_until(run, lambda: latest_id(root) > first + 1, 300, "a periodic checkpoint")


def test_requests_need_a_live_run(demo: DemoLauncher, tmp_path: Path) -> None:
    root = tmp_path / "root"
    args = DemoArgs(root, tmp_path / "out", pipeline="live", rate=50.0, backlog="100", channels=2)
    run = demo.start(args)
    demo.wait_until(run, lambda: latest_id(root) > 0, 300, "a first checkpoint")
    answered = cli("checkpoint", "--root", str(root), "--timeout", "600")
    assert answered.returncode == 0, answered.stderr + run.tail()
    assert_paused_and_resumed(demo, run, root)
    stopped = cli("stop", "--root", str(root), "--timeout", "600")
    assert stopped.returncode == 0, stopped.stderr + run.tail()
    assert run.wait(120) == 0, run.tail()
    assert_refused(root)  # stopped

    again = demo.start(args)
    last = latest_id(root)
    demo.wait_until(again, lambda: latest_id(root) > last, 300, "a checkpoint of the new run")
    again.kill()  # SIGKILL: the run's files still say it runs
    assert RunState.RUNNING in {s.state for s in Runs(str(root)).statuses()}
    assert_refused(root)  # killed
