"""Where the window operator's time goes (``bench/README.md``, *Time*): its two subtasks'
tasks driven in this one process by the tests' harness (``tests/runtime/timed_jobs.py``:
the executors' routing, a checkpoint completed per micro-batch, a memory sink), on
micro-batches shaped as ``bench/time.py``'s: 2 channels of 150,000 rows each, 100k uniform
keys, 5,000 rows per event-second per channel, up to 1.9 s out of order, a 2 s bound. Prints
the rows/s under ``cProfile`` and the functions that took the most time::

    .venv/bin/python bench/window_profile.py                  # 10 s windows
    .venv/bin/python bench/window_profile.py --window-ms 100  # about a timer per row
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "runtime"))

from timed_jobs import CHANNELS, MAX_PARALLELISM, SCHEMA, USER, Job, batch_ms

from spark_ckpt import Agg, WatermarkStrategy, WindowAggregate, Windows
from spark_ckpt.protocol.barrier import (
    KIND,
    ChannelProgress,
    CheckpointBarrier,
    RecordKind,
)
from spark_ckpt.runtime.event_time import fill_progress
from spark_ckpt.sources.channel_batch import channel_rows
from spark_ckpt.state.keygroup import subtasks_for_keys

ROWS = 150_000  # per channel and micro-batch
KEYS = 100_000
EVENT_RATE = 5_000  # rows per event-second per channel


def micro_batch(index: int, positions: dict[int, int], rng: np.random.Generator) -> pa.Table:
    """Micro-batch *index* of both channels, with its barrier and progress rows."""
    pieces = []
    for channel in CHANNELS:
        start = positions[channel]
        ts = np.arange(start, start + ROWS) * 1000 // EVENT_RATE - rng.integers(0, 20, ROWS) * 100
        user = pa.table(
            {
                "k": pa.array(rng.integers(0, KEYS, ROWS)),
                "ts": pa.array(ts, pa.int64()).cast(USER.field("ts").type),
                "v": pa.array(np.zeros(ROWS, np.int64)),
            },
            schema=USER,
        )
        positions[channel] = start + ROWS
        marks = [(start + ROWS, CheckpointBarrier(index + 1, index + 1))]
        progress = ChannelProgress(batch_ms(index), False)
        pieces.append(channel_rows(user, SCHEMA, channel, start, marks, progress=progress))
    table, _ = fill_progress(pa.concat_tables(pieces), "ts")
    return table


def feed(job: Job, index: int, table: pa.Table) -> float:
    """Route *table* to the job's tasks as the executors do; the seconds the tasks took."""
    control = pc.not_equal(table.column(KIND), RecordKind.DATA.code).to_numpy(zero_copy_only=False)
    keys = pc.fill_null(table.column("k"), 0)
    owner = subtasks_for_keys(keys, MAX_PARALLELISM, job.parallelism).to_numpy()
    parts = [table.filter(pa.array(control | (owner == s))) for s in range(job.parallelism)]
    began = time.perf_counter()
    for task, part in zip(job.tasks, parts, strict=True):
        task.process(part)
    job._complete(index + 1, index)
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window-ms", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=6, help="the first is not profiled")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    job = Job(
        lambda: WindowAggregate("windows", "k", Windows.tumbling(args.window_ms), [Agg.count()]),
        WatermarkStrategy.for_bounded_out_of_orderness("ts", 2000),
        2,
    )
    job.start(2)
    rng = np.random.default_rng(1)
    positions = dict.fromkeys(CHANNELS, 0)
    feed(job, 0, micro_batch(0, positions, rng))
    profile = cProfile.Profile()
    spent = 0.0
    for index in range(1, args.batches):
        table = micro_batch(index, positions, rng)
        profile.enable()
        spent += feed(job, index, table)
        profile.disable()
    rows = (args.batches - 1) * ROWS * len(CHANNELS)
    print(f"{rows / spent:,.0f} rows/s in one process, under cProfile")
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
