"""The replayable logs behind ``ckpt-source``: one ordered channel per source split.

A :class:`ChannelSource` has a fixed number of channels; row *o* of channel *c* never
changes once produced, so any range can be read again (replay after a failure, rewind on
restore). Three hooks, split by where they run:

* :meth:`ChannelSource.heads` — **driver** (the source runner): how many rows each channel has
  produced so far. Barriers are placed at the heads; a micro-batch never reads past them.
* :meth:`ChannelSource.plan` — **driver**: a small, picklable :class:`ReadPlan` describing
  rows ``[start, end)`` of one channel (it travels inside Spark's ``InputPartition``).
* :meth:`ReadPlan.read` — **executor**: the rows, as an Arrow table of :attr:`schema`.

``plan``/``read`` must be deterministic: the same range always yields the same rows, in the
same order, on any process.
"""

from __future__ import annotations

import operator
from typing import Protocol

import pyarrow as pa

from spark_ckpt.errors import ProtocolError


class ReadPlan(Protocol):
    """Picklable description of rows ``[start, end)`` of one channel."""

    @property
    def channel(self) -> int: ...

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...

    def read(self) -> pa.Table:
        """Executor side: the rows, exactly ``end - start`` of them, in channel order (a
        plan whose positions may have gaps also has ``read_positioned``, see
        :func:`read_rows`)."""
        ...


def read_rows(plan: ReadPlan) -> tuple[pa.Table, pa.Array | None]:
    """Executor side: the plan's rows and, for a plan whose positions may have gaps (it
    has ``read_positioned``: Kafka offsets, malformed records set aside), each row's
    position; None when row *i* is at ``start + i``."""
    positioned = getattr(plan, "read_positioned", None)
    if positioned is not None:
        table, positions = positioned()
        return table, positions
    return plan.read(), None


class ChannelSource(Protocol):
    @property
    def channels(self) -> int: ...

    @property
    def schema(self) -> pa.Schema:
        """Schema of the user columns (the barrier columns are added by ``ckpt-source``)."""
        ...

    def heads(self) -> list[int]:
        """Driver side: rows produced so far per channel (non-decreasing over calls)."""
        ...

    def plan(self, channel: int, start: int, end: int) -> ReadPlan:
        """Driver side: how to read rows ``[start, end)`` of *channel* (``end <= head``)."""
        ...


def check_channel(channel: object, channels: int, owner: str) -> int:
    """*channel* as a plain int; :class:`ProtocolError` unless ``0 <= channel < channels``."""
    if isinstance(channel, bool):
        raise ProtocolError(f"channel must be an integer, got {channel!r}")
    try:
        index = operator.index(channel)  # type: ignore[arg-type]
    except TypeError as e:
        raise ProtocolError(f"channel must be an integer, got {channel!r}") from e
    if not 0 <= index < channels:
        raise ProtocolError(f"unknown channel {index}: {owner} has {channels}")
    return index
