"""Event time at the source, as the source runner sees it: with a watermark strategy each end
offset records the micro-batch's processing time and the channels found idle, an idle source
still plans a micro-batch about once a second (a tick), and every channel's slice carries its
progress row — all of it recorded in the offsets, so a replayed batch emits the same. Drives
the stream reader the way Spark's source runner does, without Spark, on a manual clock."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from pyspark.sql.streaming.datasource import ReadAllAvailable
from test_source_stop import Heads, PolledByTheTest

from datasources.ckpt_source import CkptSource, CkptStreamReader
from spark_ckpt.coordination.topology import Topology, write_topology
from spark_ckpt.protocol.barrier import BARRIER_OPTIONS, KIND, ChannelProgress, RecordKind
from spark_ckpt.protocol.clock import ManualClock
from spark_ckpt.sources.channel_batch import channel_rows, stream_schema
from spark_ckpt.sources.stream_offset import StreamOffset
from spark_ckpt.spark.datasource.source_runner import TICK_MS, open_host


def reader_at(root: Path, **options: str) -> tuple[CkptStreamReader, Heads, ManualClock]:
    write_topology(str(root), Topology("counter", 1, None, "run"))
    source = CkptSource(
        {
            "pipeline": "p",
            "store": str(root),
            "rate": "0",
            "channels": "2",
            "checkpoint.interval": "1h",
            "watermark.column": "event_ts",
            "watermark.outOfOrderness": "1s",
            **options,
        }
    )
    reader = source.streamReader(source.schema())
    assert isinstance(reader, CkptStreamReader)
    heads = Heads(2)
    clock = ManualClock(1_000_000)
    runner = reader.runner
    runner._host = PolledByTheTest(open_host(runner.options))  # type: ignore[assignment]
    runner._source = heads  # type: ignore[assignment]
    runner._clock = clock  # type: ignore[assignment]
    return reader, heads, clock


def latest(reader: CkptStreamReader, start: StreamOffset) -> StreamOffset:
    return StreamOffset.from_dict(reader.latestOffset(start.to_dict(), ReadAllAvailable()))


def test_offsets_record_the_batch_time_and_an_idle_source_ticks(tmp_path: Path) -> None:
    reader, heads, clock = reader_at(tmp_path)
    start = StreamOffset.initial([0, 0])
    heads.now = [5, 3]
    first = latest(reader, start)
    assert first.positions == (5, 3) and first.batch_ms == clock.now_ms() and first.idle == ()
    clock.advance(TICK_MS - 1)
    assert latest(reader, first) == first  # nothing new, no tick due: no micro-batch
    clock.advance(1)
    tick = latest(reader, first)
    assert tick.positions == first.positions and tick.batch_ms == clock.now_ms()
    # the offsets carry it: Spark's offset log replays the same batch time
    assert StreamOffset.from_json(tick.to_json()) == tick
    assert json.loads(tick.to_json())["time"] == clock.now_ms()


def test_a_channel_without_new_rows_goes_idle_after_the_timeout(tmp_path: Path) -> None:
    reader, heads, clock = reader_at(tmp_path, **{"watermark.idleness": "5s"})
    offset = StreamOffset.initial([0, 0])
    idle_seen: list[tuple[int, ...]] = []
    for _ in range(8):  # channel 0 gains rows every second, channel 1 none after the first
        heads.now = [heads.now[0] + 1, 1]
        offset = latest(reader, offset)
        idle_seen.append(offset.idle)
        clock.advance(1000)
    assert idle_seen[:5] == [()] * 5 and idle_seen[5:] == [(1,)] * 3
    heads.now = [heads.now[0], 2]  # a new row: active again
    assert latest(reader, offset).idle == ()


def test_every_channel_carries_its_progress_after_its_rows(tmp_path: Path) -> None:
    reader, heads, clock = reader_at(tmp_path, **{"watermark.idleness": "1s"})
    start = StreamOffset.initial([0, 0])
    heads.now = [4, 0]
    clock.advance(0)
    end = latest(reader, start)
    clock.advance(2000)
    end = latest(reader, end)  # a tick: channel 1 idle now, channel 0 too (no new rows)
    parts = StreamOffset.initial([4, 0]).plan(end)  # what partitions() hands to read()
    assert [p.progress for p in parts] == [
        ChannelProgress(end.batch_ms, True),
        ChannelProgress(end.batch_ms, True),
    ]
    user = pa.schema([("event_ts", pa.timestamp("us", tz="UTC"))])
    rows = channel_rows(
        user.empty_table(), stream_schema(user), 0, 4, progress=parts[0].progress, end=4
    )
    assert rows.column(KIND).to_pylist() == [RecordKind.PROGRESS.code]
    assert json.loads(rows.column(BARRIER_OPTIONS)[0].as_py()) == {"idle": True, "max": None}
    assert clock.now_ms() == end.batch_ms
