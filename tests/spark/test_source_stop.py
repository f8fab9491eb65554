"""A stop with drain, as the source runner sees it: ``latestOffset`` reads up to the heads
as of the request, then the final checkpoint's barrier lands exactly there and is emitted,
however the coordinator thread's polls interleave with Spark's calls. Drives the stream
reader the way Spark's source runner does, without Spark; the coordinator thread's polls
run where the test says (they race with ``latestOffset`` in production)."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql.streaming.datasource import ReadAllAvailable

from datasources.ckpt_source import CkptSource, CkptStreamReader
from spark_ckpt.coordination.host_thread import HostThread
from spark_ckpt.coordination.mailbox import Mailbox
from spark_ckpt.coordination.messages import Request, RequestKind
from spark_ckpt.coordination.topology import Topology, write_topology
from spark_ckpt.sources.stream_offset import StreamOffset
from spark_ckpt.spark.datasource.source_runner import open_host


class Heads:
    """A source whose heads the test moves (the generator's grow with the wall clock)."""

    def __init__(self, channels: int) -> None:
        self.now = [0] * channels

    @property
    def channels(self) -> int:
        return len(self.now)

    def heads(self) -> list[int]:
        return list(self.now)


class PolledByTheTest(HostThread):
    """The coordinator thread, without its thread: each ``poll`` is one of its rounds."""

    def start(self) -> None:
        pass

    def poll(self) -> None:
        self._poll()


def reader_at(root: Path) -> tuple[CkptStreamReader, PolledByTheTest, Heads]:
    write_topology(str(root), Topology("counter", 1, None, "run"))
    source = CkptSource(
        {
            "pipeline": "p",
            "store": str(root),
            "rate": "0",
            "channels": "2",
            "checkpoint.interval": "1h",  # no periodic barrier: only the final one
        }
    )
    reader = source.streamReader(source.schema())
    assert isinstance(reader, CkptStreamReader)
    host = PolledByTheTest(open_host(reader.runner.options))
    heads = Heads(2)
    reader.runner._host, reader.runner._source = host, heads  # type: ignore[assignment]
    return reader, host, heads


def test_the_drained_stop_barrier_lands_at_the_heads_of_the_request(tmp_path: Path) -> None:
    """The final checkpoint is triggered by ``latestOffset`` (drained), and its barrier is
    taken by the next call's tick, before any poll of the thread has reported the stop.
    The barrier must still land within the drain, and be emitted there: before, it was
    placed at the heads of the moment (beyond the drain), never reached, and the stop hung
    until the checkpoint timed out."""
    reader, host, heads = reader_at(tmp_path)
    host.poll()  # installs the coordinator
    Mailbox(str(tmp_path)).post(Request("stop-1", RequestKind.STOP, drain=True))
    host.poll()  # the request: the reader drains first
    assert host.draining
    heads.now = [10, 10]
    limit = ReadAllAvailable()

    def latest(start: StreamOffset) -> StreamOffset:
        return StreamOffset.from_dict(reader.latestOffset(start.to_dict(), limit))

    start = StreamOffset.initial([0, 0])
    end = latest(start)
    assert end.positions == (10, 10)  # the heads as of the request
    heads.now = [30, 40]  # the source goes on producing
    same = latest(end)  # drained: triggers the final checkpoint, reads nothing
    assert same == end
    final = latest(end)  # takes the final barrier (no poll in between)
    stopping = host.stopping
    assert stopping is not None and stopping.checkpoint_id is not None
    assert final.positions == (10, 10)
    assert final.emitted == (stopping.checkpoint_id,) * 2
    [barrier] = [b for b in final.barriers if b.checkpoint_id == stopping.checkpoint_id]
    assert barrier.positions == (10, 10)
    host.poll()
    # nothing more is read while the final checkpoint completes
    assert latest(final).positions == (10, 10)


def test_a_checkpoint_requested_during_the_drain_lands_within_it(tmp_path: Path) -> None:
    """A checkpoint triggered while the channels drain (a client's request) is placed within
    the drain: a barrier beyond it would never be reached, and the final checkpoint would
    wait behind it (one checkpoint at a time)."""
    reader, host, heads = reader_at(tmp_path)
    host.poll()
    mailbox = Mailbox(str(tmp_path))
    mailbox.post(Request("stop-1", RequestKind.STOP, drain=True))
    host.poll()
    heads.now = [10, 10]
    limit = ReadAllAvailable()

    def latest(start: StreamOffset) -> StreamOffset:
        return StreamOffset.from_dict(reader.latestOffset(start.to_dict(), limit))

    offset = latest(StreamOffset.initial([0, 0]))
    assert offset.positions == (10, 10)
    mailbox.post(Request("cp-1", RequestKind.CHECKPOINT))
    host.poll()
    heads.now = [50, 50]
    offset = latest(offset)
    [placed] = offset.barriers
    assert placed.positions == (10, 10)
    assert offset.emitted == (placed.checkpoint_id,) * 2
