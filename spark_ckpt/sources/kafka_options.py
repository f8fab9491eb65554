"""Options of ``source=kafka``, named and parsed as Spark's Kafka source names them.

==========================  =========================================================
option                      meaning
==========================  =========================================================
``kafka.bootstrap.servers`` the brokers (required)
``subscribe``               topics, comma-separated                  (exactly one of
``subscribePattern``        a regular expression over topic names     these three)
``assign``                  JSON ``{"topic": [partition, ...]}``
``startingOffsets``         ``earliest``, ``latest`` (default), or JSON
                            ``{"topic": {"partition": offset}}`` with -2 for
                            earliest and -1 for latest; where a query starts when no
                            checkpoint exists (a checkpoint's positions win)
``maxOffsetsPerTrigger``    records per micro-batch, shared by the partitions
``failOnDataLoss``          ``true`` (default): offsets deleted by retention or
                            compaction before they were read fail the query; ``false``:
                            skip them and record what was skipped
``includeHeaders``          ``false`` (default): add a ``headers`` column
``kafkaConsumer.``          how long a metadata call, or a read that gets no record,
``pollTimeoutMs``           may take before the run fails (default 30000)
``kafka.*``                 passed to the client (without the prefix)
==========================  =========================================================

As in Spark, the client options that would take the positions out of the checkpoint's
hands are refused: ``kafka.group.id`` is allowed (offsets are committed under it for
monitoring only), ``kafka.auto.offset.reset`` (use ``startingOffsets``),
``kafka.enable.auto.commit``, the (de)serializers and interceptors are not.

Pure: parsing only. The client lives in :mod:`spark_ckpt.kafka`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from spark_ckpt.errors import ConfigError
from spark_ckpt.protocol.option import parse_int

#: ``startingOffsets`` per-partition values, as Spark's.
EARLIEST: Final = -2
LATEST: Final = -1

#: The option keys of this source (lower-case, as Spark hands them), ``kafka.*`` aside.
OPTION_KEYS: Final = frozenset(
    {
        "subscribe",
        "subscribepattern",
        "assign",
        "startingoffsets",
        "maxoffsetspertrigger",
        "failondataloss",
        "includeheaders",
        "kafkaconsumer.polltimeoutms",
    }
)
#: How long a metadata call, or a read that makes no progress, may take by default.
DEFAULT_TIMEOUT_MS: Final = 30_000
PREFIX: Final = "kafka."
#: The ``ckpt-source`` option in which a pipeline pins the partitions of a run (a JSON list
#: of channel names ``topic:partition``); not for users.
PINNED: Final = "run.channels"
#: Checkpoint property: the JSON list of the channel names of the run that took it.
CHANNEL_NAMES: Final = "source.channels"

#: Client options the source sets itself or that would move positions behind its back.
_REFUSED: Final = {
    "auto.offset.reset": "startingOffsets sets where a query without a checkpoint starts",
    "enable.auto.commit": "the checkpoint holds the positions; offsets are never auto-committed",
    "key.deserializer": "keys are always delivered as binary",
    "value.deserializer": "values are always delivered as binary",
    "key.serializer": "the source does not produce",
    "value.serializer": "the source does not produce",
    "interceptor.classes": "interceptors would see records that are read again on replay",
}


@dataclass(frozen=True)
class Subscription:
    """Which partitions the source reads: named topics, topics matching a pattern, or
    assigned partitions."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[tuple[str, int], ...] = ()

    def describe(self) -> str:
        if self.pattern is not None:
            return f"subscribePattern {self.pattern!r}"
        if self.assigned:
            return f"assign {[f'{t}-{p}' for t, p in self.assigned]}"
        return f"subscribe {list(self.topics)}"

    def matches(self, topic: str) -> bool:
        """Whether *topic* is one this subscription reads (``assign``: an assigned one)."""
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        if self.assigned:
            return any(t == topic for t, _ in self.assigned)
        return topic in self.topics


@dataclass(frozen=True)
class StartingOffsets:
    """``earliest``/``latest`` for every partition, or per partition (*specific*; a
    partition it does not name starts at *default*)."""

    default: int = LATEST
    specific: Mapping[tuple[str, int], int] = field(default_factory=dict)

    def for_partition(self, topic: str, partition: int) -> int:
        """The starting offset of a partition: an offset, or :data:`EARLIEST`/:data:`LATEST`."""
        return self.specific.get((topic, partition), self.default)


@dataclass(frozen=True)
class KafkaOptions:
    """The parsed options (see the module docstring). Picklable."""

    bootstrap_servers: str
    subscription: Subscription
    starting: StartingOffsets = StartingOffsets()
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    #: ``kafkaConsumer.pollTimeoutMs``: the bound of a metadata call or a stalled read
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    #: every ``kafka.*`` option without its prefix (``bootstrap.servers`` included)
    client: Mapping[str, str] = field(default_factory=dict)

    @property
    def group_id(self) -> str | None:
        """``kafka.group.id``: the consumer group under which the positions of each completed
        checkpoint are committed, for monitoring (lag) only; None: nothing is committed."""
        return self.client.get("group.id")

    @staticmethod
    def parse(options: Mapping[str, str]) -> KafkaOptions:
        """Parse the source's options (keys in any case; unknown keys are the caller's).
        Raises :class:`ConfigError` naming the option."""
        lowered = {k.strip().lower(): (k, str(v)) for k, v in options.items()}
        client: dict[str, str] = {}
        for low, (key, value) in lowered.items():
            if not low.startswith(PREFIX):
                continue
            name = low[len(PREFIX) :]
            if name.lower() in _REFUSED:
                raise ConfigError(key, value, f"no value: {_REFUSED[name.lower()]}")
            client[name] = value
        servers = client.get("bootstrap.servers", "").strip()
        if not servers:
            raise ConfigError(
                "kafka.bootstrap.servers", None, "the brokers to read from, e.g. 'host:9092'"
            )
        return KafkaOptions(
            bootstrap_servers=servers,
            subscription=_subscription(lowered),
            starting=_starting(lowered.get("startingoffsets")),
            max_offsets_per_trigger=_positive(lowered.get("maxoffsetspertrigger")),
            fail_on_data_loss=_bool(lowered.get("failondataloss"), True),
            include_headers=_bool(lowered.get("includeheaders"), False),
            timeout_ms=_positive(lowered.get("kafkaconsumer.polltimeoutms")) or DEFAULT_TIMEOUT_MS,
            client=client,
        )


def _subscription(options: Mapping[str, tuple[str, str]]) -> Subscription:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if k in options]
    if len(given) != 1:
        names = [options[k][0] for k in given] or "none"
        raise ConfigError(
            "subscribe", names, "exactly one of 'subscribe', 'subscribePattern' or 'assign'"
        )
    key, value = options[given[0]]
    if given[0] == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise ConfigError(key, value, "topic names, comma-separated")
        return Subscription(topics=topics)
    if given[0] == "subscribepattern":
        try:
            re.compile(value)
        except re.error as e:
            raise ConfigError(key, value, f"a regular expression ({e})") from e
        return Subscription(pattern=value)
    parsed = _json_object(key, value, '{"topic": [0, 1]}')
    assigned: list[tuple[str, int]] = []
    for topic, partitions in parsed.items():
        if not isinstance(partitions, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
        ):
            raise ConfigError(key, value, 'partitions as a list of integers, {"topic": [0, 1]}')
        assigned.extend((topic, p) for p in partitions)
    if not assigned:
        raise ConfigError(key, value, "at least one partition")
    return Subscription(assigned=tuple(sorted(set(assigned))))


def _starting(given: tuple[str, str] | None) -> StartingOffsets:
    if given is None:
        return StartingOffsets()
    key, value = given
    word = value.strip().lower()
    if word == "earliest":
        return StartingOffsets(EARLIEST)
    if word == "latest":
        return StartingOffsets(LATEST)
    accepted = 'earliest, latest, or JSON {"topic": {"0": 23, "1": -2}} (-2 earliest, -1 latest)'
    parsed = _json_object(key, value, accepted)
    specific: dict[tuple[str, int], int] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise ConfigError(key, value, accepted)
        for partition, offset in partitions.items():
            if (
                not str(partition).isdigit()
                or isinstance(offset, bool)
                or not isinstance(offset, int)
                or offset < EARLIEST
            ):
                raise ConfigError(key, value, accepted)
            specific[(topic, int(partition))] = offset
    return StartingOffsets(LATEST, specific)


def _json_object(key: str, value: str, accepted: str) -> dict[str, object]:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as e:
        raise ConfigError(key, value, f"JSON, {accepted}") from e
    if not isinstance(parsed, dict) or not parsed:
        raise ConfigError(key, value, accepted)
    return parsed


def _positive(given: tuple[str, str] | None) -> int | None:
    if given is None:
        return None
    key, value = given
    n = parse_int(key, value)
    if n < 1:
        raise ConfigError(key, value, "a positive integer")
    return n


def _bool(given: tuple[str, str] | None, default: bool) -> bool:
    if given is None:
        return default
    key, value = given
    word = value.strip().lower()
    if word not in ("true", "false"):
        raise ConfigError(key, value, "true or false")
    return word == "true"
