"""What the demo's console says (``python -m spark_ckpt.demo`` in subprocesses, classic Spark
and Spark Connect): a legend and a header, one line per completed checkpoint with every
column, "stopping..." on Ctrl-C before the final checkpoint's line and a clean exit, and none
of Spark's console noise unless ``--spark-logs`` asks for it.

Oracles: the checkpoint store (the final checkpoint's id), the legend and header constants
(what the lines must carry), and a fixed list of Spark's noise lines."""

from __future__ import annotations

import os
import re
import signal
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import DemoArgs, DemoLauncher, DemoRun

from spark_ckpt.coordination.requests import STOP
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.demo import HEADER, LEGEND

pytestmark = [pytest.mark.spark, pytest.mark.slow]

RUN_TIMEOUT_S = 300.0

#: Spark's console noise, as it printed before (one fragment per kind of line).
NOISE = (
    "resolves to a loopback address",  # the hostname warning
    "Using Spark's default log4j profile",
    "Setting default log level",
    "replaced a statically registered data source",  # DataSourceManager
    "Failed to cancel job group",
    "Streaming ForeachBatch worker",  # Spark Connect, per micro-batch
    "CANNOT_MODIFY_CONFIG",  # Spark Connect session settings
    "Using incubator modules",
)

#: A checkpoint line: id, type, duration, state, written, alignment, committed, rows/s, lag
#: rows, lag seconds.
LINE = re.compile(
    r"^\s*(\d+) (checkpoint|savepoint)\s+(\d+)\s+(\d+\.\d)\s+(\d+\.\d)\s+(\d+)\s+(\d+)"
    r"\s+(\d+|-)\s+(\d+|-)\s+(\d+\.\d|-)$"
)


def args(tmp_path: Path, **changes: object) -> DemoArgs:
    base = DemoArgs(
        root=tmp_path / "root",
        output=tmp_path / "out",
        pipeline="console",
        rate=500.0,
        backlog="200",
        channels=2,
        keys=40,
        interval="500ms",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def lines_of(run: DemoRun) -> list[str]:
    return run.log.read_text(errors="replace").splitlines()


def checkpoint_lines(lines: list[str]) -> list[tuple[int, str]]:
    """(index, line) of every line after the header that starts like a checkpoint line (a
    number)."""
    start = lines.index(HEADER) + 1 if HEADER in lines else len(lines)
    return [(i, lines[i]) for i in range(start, len(lines)) if re.match(r"^\s*\d+ ", lines[i])]


def assert_quiet(text: str) -> None:
    found = [n for n in NOISE if n in text]
    assert not found, f"Spark's noise {found} on the console:\n{text[-4000:]}"


def assert_legend_and_lines(lines: list[str]) -> list[tuple[int, re.Match[str]]]:
    text = "\n".join(lines)
    assert LEGEND in text, text
    assert HEADER in lines, text
    found = checkpoint_lines(lines)
    assert found, text
    matched = []
    for i, line in found:
        m = LINE.match(line)
        assert m is not None, f"not a full checkpoint line: {line!r}"
        assert i > lines.index(HEADER)
        matched.append((i, m))
    ids = [int(m.group(1)) for _, m in matched]
    assert ids == sorted(set(ids)), ids  # each once, increasing
    return matched


def test_ctrl_c_prints_stopping_then_the_final_checkpoint_and_exits_cleanly(
    demo: DemoLauncher, tmp_path: Path
) -> None:
    run = demo.start(args(tmp_path, seconds=900.0))
    demo.wait_until(
        run,
        lambda: len(checkpoint_lines(lines_of(run))) >= 2,
        RUN_TIMEOUT_S,
        "two checkpoint lines",
    )
    os.kill(run.popen.pid, signal.SIGINT)
    assert run.wait(RUN_TIMEOUT_S) == 0, run.tail()
    lines = lines_of(run)
    text = "\n".join(lines)
    assert "Traceback" not in text, text
    assert_quiet(text)
    matched = assert_legend_and_lines(lines)
    final = DeltaCheckpointStore(str(run.args.root)).latest_completed()
    assert final is not None and STOP in final.properties, text
    stopping = [i for i, line in enumerate(lines) if line.startswith("stopping")]
    assert len(stopping) == 1, text
    [final_line] = [i for i, m in matched if int(m.group(1)) == final.checkpoint_id]
    stopped = [i for i, line in enumerate(lines) if line.startswith("stopped (interrupt)")]
    assert stopped, text
    assert stopping[0] < final_line < stopped[0], text
    assert final_line == matched[-1][0], text  # nothing after the final checkpoint
    # throughput from the second line on, and a lag figure wherever the query's progress
    # was known (the generator's rate is known: lag in seconds too)
    assert all(m.group(8) != "-" for _, m in matched[1:]), text
    assert all((m.group(9) == "-") == (m.group(10) == "-") for _, m in matched), text


def test_spark_logs_brings_spark_console_back(demo: DemoLauncher, tmp_path: Path) -> None:
    quiet = demo.start(args(tmp_path / "quiet", rate=0.0, available_now=True))
    assert quiet.wait(RUN_TIMEOUT_S) == 0, quiet.tail()
    text = quiet.log.read_text(errors="replace")
    assert_quiet(text)
    assert_legend_and_lines(text.splitlines())
    loud = demo.start(
        args(tmp_path / "loud", rate=0.0, available_now=True, extra=("--spark-logs",))
    )
    assert loud.wait(RUN_TIMEOUT_S) == 0, loud.tail()
    text = loud.log.read_text(errors="replace")
    assert "Using Spark's default log4j profile" in text, text[-4000:]
    assert_legend_and_lines(text.splitlines())


@pytest.mark.compat  # quiet under every PySpark
def test_spark_connect_console_is_quiet(demo: DemoLauncher, tmp_path: Path) -> None:
    run = demo.start(args(tmp_path, rate=0.0, available_now=True, remote="local[2]"))
    assert run.wait(RUN_TIMEOUT_S) == 0, run.tail()
    text = run.log.read_text(errors="replace")
    assert "on Spark Connect local[2]" in text, text
    assert_quiet(text)
    assert "Traceback" not in text, text
    assert_legend_and_lines(text.splitlines())
