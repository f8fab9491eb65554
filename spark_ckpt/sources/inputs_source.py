"""Several named inputs behind one ``ckpt-source``: the channels of every input, one after
the other, in the union form of :mod:`spark_ckpt.sources.inputs`.

One source runner, hence one coordinator, places every checkpoint's barriers on the channels
of every input, and a checkpoint records all their positions: Flink's several sources of one
job, snapshotted by one checkpoint. Each input keeps its own rules (a Kafka topic its offsets,
a Delta table its versions); the channels are named ``<input>/<channel>`` (a Kafka input:
``<input>/<topic>-<partition>``), so a restore resumes each input's channels by name, and an
input added later starts where that input starts (its ``startingOffsets``, its first row).

The hooks run where a :class:`~spark_ckpt.sources.channel_source.ChannelSource`'s run:
:meth:`InputsSource.heads` and :meth:`InputsSource.plan` in the source runner,
:meth:`InputPlan.read` on the executors. Pure: pyarrow only (the inner sources are opened by
the caller).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from spark_ckpt.errors import ConfigError
from spark_ckpt.sources.channel_source import ChannelSource, ReadPlan, check_channel, read_rows
from spark_ckpt.sources.inputs import Inputs, InputSpec


@dataclass(frozen=True)
class InputPlan:
    """Rows ``[start, end)`` of one channel of input *input*, read by its own plan and put
    in the union form (picklable: travels to the executors)."""

    inner: ReadPlan
    inputs: Inputs
    input: str
    schema: pa.Schema  # the union form's user columns
    channel: int  # the global channel

    @property
    def start(self) -> int:
        return self.inner.start

    @property
    def end(self) -> int:
        return self.inner.end

    def read(self) -> pa.Table:
        return self.read_positioned()[0]

    def read_positioned(self) -> tuple[pa.Table, pa.Array | None]:
        """Executor side: the rows in the union form, and their positions when the input's
        have gaps (see :func:`~spark_ckpt.sources.channel_source.read_rows`)."""
        rows, positions = read_rows(self.inner)
        return self.inputs.wrap(self.input, rows, self.schema), positions


class InputsSource:
    """The channels of several inner sources (see the module docstring). *sources*: each
    input's opened source, in the order of *inputs*."""

    def __init__(self, inputs: Inputs, sources: Sequence[ChannelSource]) -> None:
        if len(sources) != len(inputs.inputs):
            raise ConfigError("sources", len(sources), f"{len(inputs.inputs)} inner sources")
        for spec, source in zip(inputs.inputs, sources, strict=True):
            if source.channels != spec.channels:
                raise ConfigError(
                    f"sources.{spec.name}",
                    source.channels,
                    f"{spec.channels} channels, as the pipeline counted when the run began",
                )
        self.inputs = inputs
        self.sources = tuple(sources)
        self._schema = inputs.union_schema(
            {s.name: src.schema for s, src in zip(inputs.inputs, sources, strict=True)},
            key_type(inputs, [src.schema for src in sources]),
        )

    @property
    def channels(self) -> int:
        return self.inputs.channels

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def channel_names(self) -> list[str]:
        """``<input>/<name>``: an inner source's own channel names (Kafka's), else its
        channel numbers."""
        names: list[str] = []
        for spec, source in zip(self.inputs.inputs, self.sources, strict=True):
            own: list[str] | None = getattr(source, "channel_names", None)
            local = own if own is not None else [str(c) for c in range(source.channels)]
            names.extend(f"{spec.name}/{n}" for n in local)
        return names

    def heads(self) -> list[int]:
        return [h for source in self.sources for h in source.heads()]

    def heads_available_now(self) -> list[int]:
        return [
            h
            for source in self.sources
            for h in getattr(source, "heads_available_now", source.heads)()
        ]

    def start_positions(self) -> list[int]:
        """Where each channel starts without a checkpoint (its input's own start)."""
        out: list[int] = []
        for source in self.sources:
            start = getattr(source, "start_positions", None)
            out.extend([0] * source.channels if start is None else start())
        return out

    def earliest(self, channels: Sequence[int]) -> dict[int, int]:
        """Where each of *channels* starts: an input the checkpoint does not know starts
        where it starts without one (Kafka: its earliest offset)."""
        out: dict[int, int] = {}
        starts: list[int] | None = None
        for channel in channels:
            spec, local = self.inputs.local_channel(channel)
            source = self.sources[self.inputs.names.index(spec.name)]
            earliest = getattr(source, "earliest", None)
            if earliest is not None:
                out[channel] = earliest([local])[local]
                continue
            if starts is None:
                starts = self.start_positions()
            out[channel] = starts[channel]
        return out

    def resume_from(self, positions: Sequence[int]) -> None:
        for spec, source in zip(self.inputs.inputs, self.sources, strict=True):
            resume = getattr(source, "resume_from", None)
            if resume is not None:
                span = self.inputs.ranges[spec.name]
                resume(list(positions[span.start : span.stop]))

    def admit(self, positions: Sequence[int], target: Sequence[int]) -> list[int]:
        out: list[int] = []
        for spec, source in zip(self.inputs.inputs, self.sources, strict=True):
            span = self.inputs.ranges[spec.name]
            mine, aim = (
                list(positions[span.start : span.stop]),
                list(target[span.start : span.stop]),
            )
            admit = getattr(source, "admit", None)
            out.extend(aim if admit is None else admit(mine, aim))
        return out

    def checkpoint_completed(self, checkpoint_id: int, positions: Sequence[int]) -> None:
        for spec, source in zip(self.inputs.inputs, self.sources, strict=True):
            notify = getattr(source, "checkpoint_completed", None)
            if notify is not None:
                span = self.inputs.ranges[spec.name]
                notify(checkpoint_id, list(positions[span.start : span.stop]))

    def discover(self) -> list[tuple[str, int]]:
        """The channels the inputs' sources find now that this run does not read (new Kafka
        partitions), each named ``<input>/<topic>`` with its partition; the source runner then
        ends the run for a restart that reads them, as for a source of its own."""
        found: list[tuple[str, int]] = []
        for spec, source in zip(self.inputs.inputs, self.sources, strict=True):
            discover = getattr(source, "discover", None)
            if discover is not None:
                found.extend((f"{spec.name}/{topic}", p) for topic, p in discover())
        return found

    def plan(self, channel: int, start: int, end: int) -> InputPlan:
        channel = check_channel(channel, self.channels, "the inputs")
        spec, local = self.inputs.local_channel(channel)
        source = self.sources[self.inputs.names.index(spec.name)]
        return InputPlan(
            source.plan(local, start, end), self.inputs, spec.name, self._schema, channel
        )

    def close(self) -> None:
        for source in self.sources:
            close = getattr(source, "close", None)
            if close is not None:
                close()


def key_type(inputs: Inputs, schemas: Sequence[pa.Schema]) -> pa.DataType | None:
    """The Arrow type of the inputs' key columns, which must agree (None: not keyed).
    :class:`ConfigError` naming the inputs whose key columns differ, or lack the key."""
    types: dict[str, pa.DataType] = {}
    for spec, schema in zip(inputs.inputs, schemas, strict=True):
        if spec.key_column is None or spec.transformed:  # a transform makes its key
            continue
        index = schema.get_field_index(spec.key_column)
        if index < 0:
            raise ConfigError(
                f"key of input {spec.name!r}",
                spec.key_column,
                f"a column of input {spec.name!r}: {schema.names}",
            )
        types[spec.name] = schema.field(index).type
    if not types:
        return None
    if len(set(types.values())) > 1:
        described = ", ".join(f"{n}: {t}" for n, t in types.items())
        raise ConfigError(
            "keys",
            described,
            "key columns of one Arrow type on every input (cast one in a transform)",
        )
    return next(iter(types.values()))


__all__ = ["InputPlan", "InputSpec", "InputsSource", "key_type"]
