"""Exactly-once from Kafka under SIGKILL: a producer keeps writing to a topic with 3
partitions while the main job (``python -m spark_ckpt.demo --kafka``: Kafka → keyed running
count per record key → Delta) is killed and restarted; mid-run a new topic matching the
job's ``subscribePattern`` appears and is written to. A final run drains what was produced.
The oracle is a plain fold over what the producer wrote (delivery confirmed by the broker),
compared with the output table read back without spark-ckpt."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import DemoArgs, DemoLauncher, output_rows, read_delta, running_count_rows

from spark_ckpt.coordination.requests import STOP
from spark_ckpt.delta.delta_store import DeltaCheckpointStore
from spark_ckpt.testing.broker import Broker, produce, running_broker

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KEYS = [f"user-{i}".encode() for i in range(11)]
KILLS = 3
#: Liveness bounds (never part of an assertion about speed).
CHECKPOINT_TIMEOUT_S = 240.0
FINAL_RUN_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with running_broker() as b:
        yield b


class Producer:
    """Writes records to every partition of the topics it is given, one batch of a few
    records per partition every 100 ms, on a thread; counts the keys the broker confirmed."""

    def __init__(self, broker: Broker, seed: int) -> None:
        self.broker = broker
        self.rng = random.Random(seed)
        self.topics: dict[str, int] = {}
        self.keys: Counter[bytes] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add_topic(self, topic: str, partitions: int) -> None:
        self.broker.create_topic(topic, partitions)
        with self._lock:
            self.topics[topic] = partitions

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                topics = dict(self.topics)
            for topic, partitions in topics.items():
                for partition in range(partitions):
                    keys = [self.rng.choice(KEYS) for _ in range(3)]
                    produce(
                        self.broker.bootstrap,
                        topic,
                        [(k, b"{}") for k in keys],
                        partition=partition,
                    )
                    with self._lock:
                        self.keys.update(keys)
            time.sleep(0.1)

    def __enter__(self) -> Producer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def _latest_id(root: Path) -> int:
    if not (root / "checkpoints").exists():
        return 0
    latest = DeltaCheckpointStore(str(root)).latest_completed()
    return latest.checkpoint_id if latest else 0


# aligned only: the other modes under SIGKILL share the Kafka source's code paths with it and
# run in test_crash.py (each kill is a job start, the suite's largest cost)
@pytest.mark.parametrize(("mode", "seed"), [("aligned", 21)])
def test_exactly_once_from_kafka_under_sigkill_with_a_new_topic(
    demo: DemoLauncher, broker: Broker, tmp_path: Path, mode: str, seed: int
) -> None:
    prefix = f"clicks-{uuid.uuid4().hex[:6]}"
    args = DemoArgs(
        root=tmp_path / "root",
        output=tmp_path / "out",
        mode=mode,
        pipeline="kafka-crash",
        interval="300ms",
        kafka=broker.bootstrap,
        kafka_pattern=f"{prefix}-.*",
        max_rows_per_trigger=600,
    )
    rng = random.Random(seed)
    story = []
    with Producer(broker, seed) as producer:
        producer.add_topic(f"{prefix}-m", 3)
        for i in range(KILLS):
            before = _latest_id(args.root)
            run = demo.start(args)
            demo.wait_until(
                run,
                lambda: _latest_id(args.root) > before,  # noqa: B023 - used at once
                CHECKPOINT_TIMEOUT_S,
                f"a completed checkpoint in run {i}",
            )
            if i == 1:  # mid-run: a topic the pattern matches appears (discovered in 1 s); it
                # sorts first, so every partition of the first topic changes its index
                producer.add_topic(f"{prefix}-a", 2)
            time.sleep(rng.uniform(0.0, 3.0))
            run.kill()
            story.append(f"kill {i}: latest checkpoint {before} -> {_latest_id(args.root)}")
    final_run = demo.start(replace(args, available_now=True))
    code = final_run.wait(FINAL_RUN_TIMEOUT_S)
    assert code == 0, f"final run failed ({code})\n{final_run.tail()}"
    final = DeltaCheckpointStore(str(args.root)).latest_completed()
    assert final is not None and STOP in final.properties, final_run.tail()
    expected = running_count_rows(producer.keys)
    actual = output_rows(read_delta(args.output), "key")
    missing, extra = expected - actual, actual - expected
    assert actual == expected, (
        f"{sum(actual.values())} rows, expected {sum(expected.values())}; missing "
        f"{sum(missing.values())}, extra {sum(extra.values())}\n" + "\n".join(story)
    )
