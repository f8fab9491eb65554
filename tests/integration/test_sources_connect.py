"""``source=kafka`` (with Spark SQL parsing its JSON values before the keyed operator) and
``source=files`` under Spark Connect (``demo --remote local[2]``): two ``--available-now``
runs each, the second resuming from the first's final checkpoint after more input arrived;
the output is the fold over the whole input, exactly once."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DemoArgs, DemoLauncher, output_rows, read_delta, running_count_rows

from spark_ckpt.testing.broker import Broker, produce, running_broker

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REMOTE = "local[2]"
RUN_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with running_broker() as b:
        yield b


def test_kafka_json_values_parsed_under_spark_connect(
    demo: DemoLauncher, broker: Broker, tmp_path: Path
) -> None:
    broker.create_topic("connect-events", 2)
    users: Counter[int] = Counter()

    def send(start: int, n: int) -> None:
        for p in range(2):
            ids = [(i * 7 + p) % 23 for i in range(start, start + n)]
            values = [(None, json.dumps({"user_id": u, "page": "x"}).encode()) for u in ids]
            values.append((None, b"not json"))  # parsed to null, filtered out by the transform
            produce(broker.bootstrap, "connect-events", values, partition=p)
            users.update(ids)

    args = DemoArgs(
        root=tmp_path / "root",
        output=tmp_path / "out",
        pipeline="connect-kafka",
        interval="500ms",
        kafka=broker.bootstrap,
        kafka_pattern="connect-events",
        kafka_json=True,
        available_now=True,
        remote=REMOTE,
    )
    send(0, 60)
    first = demo.start(args)
    assert first.wait(RUN_TIMEOUT_S) == 0, first.tail()
    assert "Traceback" not in first.tail(200), first.tail(200)
    send(60, 40)
    second = demo.start(args)
    assert second.wait(RUN_TIMEOUT_S) == 0, second.tail()
    assert output_rows(read_delta(args.output)) == running_count_rows(users)


def test_files_under_spark_connect(demo: DemoLauncher, tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    users: Counter[int] = Counter()

    def land(name: str, ids: list[int]) -> None:
        (landing / f".{name}").write_text("".join(json.dumps({"user_id": u}) + "\n" for u in ids))
        os.replace(landing / f".{name}", landing / name)
        users.update(ids)

    args = DemoArgs(
        root=tmp_path / "root",
        output=tmp_path / "out",
        pipeline="connect-files",
        interval="500ms",
        channels=2,
        files=landing,
        available_now=True,
        remote=REMOTE,
    )
    for i in range(3):
        land(f"a-{i}.json", [(i * 5 + j) % 17 for j in range(30)])
    first = demo.start(args)
    assert first.wait(RUN_TIMEOUT_S) == 0, first.tail()
    land("b-0.json", list(range(17)))
    second = demo.start(args)
    assert second.wait(RUN_TIMEOUT_S) == 0, second.tail()
    assert output_rows(read_delta(args.output)) == running_count_rows(users)
