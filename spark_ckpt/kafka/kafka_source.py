"""``source=kafka``: one channel per topic partition, positions are Kafka offsets.

A :class:`~spark_ckpt.sources.channel_source.ChannelSource` over the partitions a run reads,
fixed for the run and named ``topic:partition`` (:func:`channel_name`):

* ``heads`` — driver (the source runner): each partition's high watermark;
* ``plan`` — driver: a :class:`KafkaReadPlan` of offsets ``[start, end)``;
* :meth:`KafkaReadPlan.read` — executors: the records, by assign and seek
  (:func:`~spark_ckpt.kafka.kafka_client.read_range`); a range with gaps (transaction markers,
  compaction) has fewer rows than offsets, each row at its own offset (``read_positioned``).

**Names, not indexes.** Every checkpoint records the run's channel names (a checkpoint
property, :data:`~spark_ckpt.sources.kafka_options.CHANNEL_NAMES`), and a run resumes each
partition at the position the checkpoint holds for its name (:func:`resume_positions`), wherever the
partition is in the run's order. A partition the checkpoint does not name is new: it starts
at its earliest offset, as a partition discovered by Flink's Kafka source does; one without a
checkpoint starts where ``startingOffsets`` says.

**Discovery.** The partitions are fixed when a run starts: the pipeline pins them in the
source options (:data:`~spark_ckpt.sources.kafka_options.PINNED`), so that the subtasks and
the source runner agree. The source runner looks for new partitions (a topic grown, a new
topic matching ``subscribePattern``) every ``partitionDiscoveryIntervalMs``; when it finds
some it ends the run with a final checkpoint, and
:meth:`Pipeline.run <spark_ckpt.pipeline.pipeline.Pipeline.run>` starts the next run, which reads
them too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from spark_ckpt.errors import ConfigError, SourceError, StoreError
from spark_ckpt.kafka.kafka_client import KafkaMetadata, read_range, record_schema
from spark_ckpt.locations.objects import write_whole
from spark_ckpt.locations.uris import filesystem
from spark_ckpt.sources.kafka_options import PINNED, KafkaOptions

log = logging.getLogger(__name__)


def channel_name(topic: str, partition: int) -> str:
    """A partition's channel name (Kafka topic names never contain ``:``)."""
    return f"{topic}:{partition}"


def parse_channel_name(name: str) -> tuple[str, int]:
    topic, _, partition = name.rpartition(":")
    if not topic or not partition.isdigit():
        raise ConfigError(PINNED, name, "channel names 'topic:partition'")
    return topic, int(partition)


#: Under the pipeline root: a record per range of offsets deleted before it was read and
#: skipped (``failOnDataLoss=false``).
DATA_LOSS_DIR = "_sources/kafka-data-loss"


@dataclass(frozen=True)
class KafkaReadPlan:
    """Offsets ``[start, end)`` of one partition (picklable; read on an executor). *root*:
    the pipeline root, where skipped offsets are recorded (:data:`DATA_LOSS_DIR`)."""

    options: KafkaOptions
    topic: str
    partition: int
    channel: int
    start: int
    end: int
    root: str | None = None

    def read(self) -> pa.Table:
        got = read_range(self.options, self.topic, self.partition, self.start, self.end)
        if got.lost is not None:
            self._record_loss(*got.lost)
        return got.table

    def _record_loss(self, first: int, end: int) -> None:
        """Record the skipped offsets under the root, on any store (one JSON object per
        range, written whole: a replay writes the same one). A record that cannot be
        written is logged; the read goes on, as it would without a root."""
        if self.root is None:
            return
        name = f"{self.topic}-{self.partition}-{first}-{end}.json"
        record = {"topic": self.topic, "partition": self.partition, "from": first, "to": end}
        try:
            fs, base = filesystem(self.root)
            write_whole(fs, f"{base}/{DATA_LOSS_DIR}/{name}", json.dumps(record).encode())
        except StoreError as e:
            log.error("cannot record skipped offsets %s under %s: %s", name, self.root, e)

    def read_positioned(self) -> tuple[pa.Table, pa.Array]:
        """The records and each one's position, its offset (offsets may have gaps)."""
        table = self.read()
        return table, table.column("offset").combine_chunks()


class KafkaChannelSource:
    """See the module docstring. Driver side; :meth:`close` releases its client."""

    def __init__(
        self,
        options: KafkaOptions,
        partitions: Sequence[tuple[str, int]] | None = None,
        *,
        metadata: KafkaMetadata | None = None,
        root: str | None = None,
    ) -> None:
        self.options = options
        self.root = root
        self._metadata = metadata or KafkaMetadata(options)
        found = self._metadata.partitions() if partitions is None else list(partitions)
        if not found:
            self.close()
            raise SourceError(
                f"Kafka at {options.bootstrap_servers}: no partition of "
                f"{options.subscription.describe()} exists yet; create the topic first"
            )
        self.partitions: tuple[tuple[str, int], ...] = tuple(found)
        self._heads = [0] * len(self.partitions)

    @staticmethod
    def from_options(options: Mapping[str, str], root: str | None = None) -> KafkaChannelSource:
        """The source of the ``ckpt-source`` options (lower-cased keys): the Kafka options,
        and the pinned partitions if the pipeline pinned them; *root*: the pipeline root."""
        parsed = KafkaOptions.parse(options)
        pinned = options.get(PINNED)
        if pinned is None:
            return KafkaChannelSource(parsed, root=root)
        try:
            names = json.loads(pinned)
        except json.JSONDecodeError as e:
            raise ConfigError(PINNED, pinned, "a JSON list of channel names") from e
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ConfigError(PINNED, pinned, "a JSON list of channel names")
        return KafkaChannelSource(parsed, [parse_channel_name(n) for n in names], root=root)

    def close(self) -> None:
        self._metadata.close()

    @property
    def channels(self) -> int:
        return len(self.partitions)

    @property
    def channel_names(self) -> list[str]:
        return [channel_name(t, p) for t, p in self.partitions]

    @property
    def schema(self) -> pa.Schema:
        return record_schema(self.options.include_headers)

    @property
    def max_rows_per_trigger(self) -> int | None:
        return self.options.max_offsets_per_trigger

    def heads(self) -> list[int]:
        """Each partition's high watermark (never below the previous call's)."""
        marks = self._metadata.watermarks(self.partitions)
        self._heads = [max(h, m.high) for h, m in zip(self._heads, marks, strict=True)]
        return list(self._heads)

    def start_positions(self) -> list[int]:
        """Where each partition starts without a checkpoint (``startingOffsets``)."""
        return self._metadata.starting_offsets(self.partitions)

    def earliest(self, channels: Sequence[int]) -> dict[int, int]:
        """The earliest offset of each of *channels* (a partition new to a checkpoint)."""
        marks = self._metadata.watermarks([self.partitions[c] for c in channels])
        return {c: m.low for c, m in zip(channels, marks, strict=True)}

    def checkpoint_completed(self, checkpoint_id: int, positions: Sequence[int]) -> None:
        """Source runner, after checkpoint *checkpoint_id* completed with *positions* (per
        channel of this run): with ``kafka.group.id``, commit them as the group's offsets, as
        Flink's KafkaSource does, so lag tools see the progress. Monitoring only: the
        checkpoint stays the truth for positions, and a failed commit is logged, not raised.
        Idempotent."""
        if self.options.group_id is None:
            return
        try:
            self._metadata.commit(self.partitions, positions)
        except SourceError as e:
            log.warning(
                "checkpoint %d: offsets not committed (monitoring only): %s", checkpoint_id, e
            )

    def discover(self) -> list[tuple[str, int]]:
        """Partitions the subscription reads now that this run does not (sorted)."""
        return sorted(set(self._metadata.partitions()) - set(self.partitions))

    def plan(self, channel: int, start: int, end: int) -> KafkaReadPlan:
        topic, partition = self.partitions[channel]
        return KafkaReadPlan(self.options, topic, partition, channel, start, end, self.root)


def resume_positions(
    names: Sequence[str],
    checkpoint_names: Sequence[str] | None,
    offsets: Mapping[int, int],
    earliest: Mapping[int, int],
) -> list[int]:
    """Positions of the run's channels *names* from a checkpoint that holds *offsets* per
    channel index of its own run, whose channel names were *checkpoint_names*: by name; a
    channel the checkpoint does not name starts at *earliest* (per channel of this run).
    Partitions the checkpoint names that this run does not read are dropped, logged."""
    if checkpoint_names is None:
        raise SourceError(
            "the checkpoint does not name its channels (it was not taken by a Kafka source): "
            "a Kafka source cannot resume from it"
        )
    at = {name: offsets[i] for i, name in enumerate(checkpoint_names) if i in offsets}
    gone = sorted(set(at) - set(names))
    if gone:
        log.warning("partitions %s of the checkpoint are no longer read: dropped", gone)
    return [at[n] if n in at else earliest[c] for c, n in enumerate(names)]
