"""What the console says, without Spark: the JVM stderr line filter, the summary of a
pipeline run (``print(result)``), the demo's checkpoint lines, and the hand-over of a local
Connect server's settings. Oracles are the values the tests construct."""

from __future__ import annotations

import os
import threading

from spark_ckpt.demo import HEADER, CheckpointLine
from spark_ckpt.pipeline.supervisor import RunResult, StopReason
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.state_handles import SourceOffset, TaskId, TaskStateHandle
from spark_ckpt.spark.session.spark_logs import DROPPED_LINES, filter_lines


def checkpoint(cid: int, trigger_ms: int, positions: list[int]) -> CompletedCheckpoint:
    task = TaskStateHandle(
        TaskId("_source", 0),
        (),
        tuple(SourceOffset("_source", c, p) for c, p in enumerate(positions)),
    )
    return CompletedCheckpoint(
        cid,
        SnapshotType.CHECKPOINT,
        (task,),
        CheckpointStats(trigger_ms, trigger_ms + 250, state_bytes=4096, bytes_written=2048),
    )


# -- the JVM's stderr ---------------------------------------------------------------------------


def test_filter_drops_exactly_the_listed_lines() -> None:
    lines = [
        b"26/11/25 14:13:08 ERROR Executor: a real failure\n",
        b"Streaming ForeachBatch worker is starting with url sc://localhost:15002/\n",
        b"Streaming ForeachBatch worker Started batch 3 with DF id x\n",
        b"WARNING: Using incubator modules: jdk.incubator.vector\n",
        b"  at org.apache.spark.Something(Something.scala:1)\n",
        b"a line about Streaming ForeachBatch worker in the middle\n",
        b"no newline at the end",
    ]
    kept = [line for line in lines if not any(line.startswith(p) for p in DROPPED_LINES)]
    assert len(kept) == 4  # the oracle drops three: the test's input is what it says
    source_r, source_w = os.pipe()
    sink_r, sink_w = os.pipe()
    with os.fdopen(source_r, "rb") as stream:
        pump = threading.Thread(target=filter_lines, args=(stream, sink_w))
        pump.start()
        with os.fdopen(source_w, "wb") as writer:
            writer.write(b"".join(lines))
        pump.join(timeout=30)
    os.close(sink_w)
    with os.fdopen(sink_r, "rb") as out:
        assert out.read() == b"".join(kept)


# -- print(result) --------------------------------------------------------------------------------


def test_run_result_prints_a_short_summary() -> None:
    last = checkpoint(1017, 5_000, [40, 60])
    result = RunResult(
        2,
        last,
        StopReason.INTERRUPT,
        (None, 1011, 2003),
        ("TypeError: boom", "StoreError: gone"),
        checkpoints_completed=17,
        checkpoints_failed=3,
        rows=12_345,
        duration_s=63.25,
    )
    text = str(result)
    lines = text.splitlines()
    assert 3 <= len(lines) <= 6, text
    assert "17 completed" in text and "3 failed" in text
    assert "1017" in text and "12,345" in text and "63.2 s" in text
    assert "Ctrl-C" in lines[0]
    assert "restarts: 2" in text and "1011, 2003" in text
    assert "StoreError: gone" in text  # the last failure, not every one
    assert "TypeError" not in text
    assert "CompletedCheckpoint" not in text and "TaskStateHandle" not in text
    one = repr(result)
    assert "\n" not in one and "checkpoints_completed=17" in one and len(one) < 250


def test_run_result_summary_without_checkpoints() -> None:
    text = str(RunResult(0, None, StopReason.FINISHED))
    assert "0 completed" in text and "last: none" in text
    assert len(text.splitlines()) <= 6


# -- the demo's checkpoint lines ------------------------------------------------------------------


def columns(line: str) -> list[str]:
    return line.split()


def test_checkpoint_lines_rate_and_lag() -> None:
    heads: list[list[int] | None] = [[500, 700], None, None]
    line = CheckpointLine(lambda: heads.pop(0), rate=100.0)
    first = columns(line.format(checkpoint(7, 10_000, [100, 200]), committed=300))
    assert len(first) == 10  # the header's ten columns
    assert first[0] == "7" and first[1] == "checkpoint"
    assert first[7] == "-"  # no previous checkpoint: no rate
    assert first[8] == str(500 + 700 - 300) and first[9] == f"{900 / 100.0:.1f}"
    # 2 s later, 400 more rows: 200 rows/s; the query's heads unknown now: the last ones
    second = columns(line.format(checkpoint(8, 12_000, [300, 400]), committed=700))
    assert second[6] == "700" and second[7] == "200"
    assert second[8] == str(1200 - 700) and second[9] == "5.0"
    unknown = CheckpointLine(lambda: None, rate=None)
    third = columns(unknown.format(checkpoint(1001, 1, [0]), committed=0))
    assert third[0] == "1001" and third[8:] == ["-", "-"]


def test_checkpoint_line_never_shows_negative_lag() -> None:
    line = CheckpointLine(lambda: [10, 10], rate=None)
    cols = columns(line.format(checkpoint(3, 1, [50, 50]), committed=0))
    assert cols[8] == "0" and cols[9] == "-"


def test_header_names_every_column() -> None:
    for name in ("id", "type", "dur ms", "state KiB", "written KiB", "align ms", "committed"):
        assert name in HEADER
    for name in ("rows/s", "lag rows", "lag s"):
        assert name in HEADER
