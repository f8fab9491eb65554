"""``source=kafka`` options, named and parsed as Spark's Kafka source (pure, no broker)."""

from __future__ import annotations

import re

import pytest

from spark_ckpt.errors import ConfigError
from spark_ckpt.sources.kafka_options import EARLIEST, LATEST, KafkaOptions, Subscription

BASE = {"kafka.bootstrap.servers": "b1:9092,b2:9092"}


def test_the_defaults_are_spark_s() -> None:
    o = KafkaOptions.parse({**BASE, "subscribe": "orders, payments"})
    assert o.bootstrap_servers == "b1:9092,b2:9092"
    assert o.subscription == Subscription(topics=("orders", "payments"))
    assert o.starting.for_partition("orders", 0) == LATEST
    assert (o.max_offsets_per_trigger, o.fail_on_data_loss, o.include_headers) == (
        None,
        True,
        False,
    )
    assert o.client == {"bootstrap.servers": "b1:9092,b2:9092"}


def test_options_in_any_case_and_client_options_pass_through() -> None:
    o = KafkaOptions.parse(
        {
            "KAFKA.BOOTSTRAP.SERVERS": "b:1",
            "subscribepattern": "orders-.*",
            "STARTINGOFFSETS": "earliest",
            "maxOffsetsPerTrigger": "500",
            "failOnDataLoss": "False",
            "includeHeaders": "true",
            "kafka.security.protocol": "SSL",
            "kafka.group.id": "monitoring",
            "kafkaConsumer.pollTimeoutMs": "2500",
        }
    )
    assert o.timeout_ms == 2500
    assert o.subscription.matches("orders-eu") and not o.subscription.matches("refunds")
    assert o.starting.for_partition("orders-eu", 3) == EARLIEST
    assert (o.max_offsets_per_trigger, o.fail_on_data_loss, o.include_headers) == (
        500,
        False,
        True,
    )
    assert o.client["security.protocol"] == "SSL" and o.client["group.id"] == "monitoring"


def test_assign_and_per_partition_starting_offsets() -> None:
    o = KafkaOptions.parse(
        {
            **BASE,
            "assign": '{"a": [1, 0], "b": [2]}',
            "startingOffsets": '{"a": {"0": 23, "1": -2}, "b": {"2": -1}}',
        }
    )
    assert o.subscription.assigned == (("a", 0), ("a", 1), ("b", 2))
    assert o.subscription.matches("a") and not o.subscription.matches("c")
    assert [o.starting.for_partition(t, p) for t, p in o.subscription.assigned] == [
        23,
        EARLIEST,
        LATEST,
    ]
    assert o.starting.for_partition("a", 9) == LATEST  # not named: latest, as in Spark


@pytest.mark.parametrize(
    ("options", "option", "expected"),
    [
        ({"subscribe": "t"}, "kafka.bootstrap.servers", "brokers"),
        ({**BASE}, "subscribe", "exactly one of"),
        ({**BASE, "subscribe": "t", "assign": '{"t": [0]}'}, "subscribe", "exactly one of"),
        ({**BASE, "subscribe": " , "}, "subscribe", "topic names"),
        ({**BASE, "subscribePattern": "(("}, "subscribePattern", "regular expression"),
        ({**BASE, "assign": "[0]"}, "assign", '{"topic": [0, 1]}'),
        ({**BASE, "assign": '{"t": ["x"]}'}, "assign", "list of integers"),
        ({**BASE, "assign": '{"t": []}'}, "assign", "at least one partition"),
        ({**BASE, "subscribe": "t", "startingOffsets": "oldest"}, "startingOffsets", "earliest"),
        (
            {**BASE, "subscribe": "t", "startingOffsets": '{"t": {"0": -3}}'},
            "startingOffsets",
            "-2 earliest",
        ),
        ({**BASE, "subscribe": "t", "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger", "posi"),
        ({**BASE, "subscribe": "t", "maxOffsetsPerTrigger": "x"}, "maxOffsetsPerTrigger", "int"),
        ({**BASE, "subscribe": "t", "failOnDataLoss": "yes"}, "failOnDataLoss", "true or false"),
        (
            {**BASE, "subscribe": "t", "kafka.auto.offset.reset": "x"},
            "kafka.auto.offset.reset",
            "startingOffsets",
        ),
        (
            {**BASE, "subscribe": "t", "kafka.enable.auto.commit": "1"},
            "kafka.enable.auto.commit",
            "never auto",
        ),
        (
            {**BASE, "subscribe": "t", "kafka.value.deserializer": "x"},
            "kafka.value.deserializer",
            "binary",
        ),
    ],
)
def test_a_bad_option_is_named(options: dict[str, str], option: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(expected)) as e:
        KafkaOptions.parse(options)
    assert e.value.option == option
