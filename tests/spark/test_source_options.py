"""Source options given to a pipeline (``Pipeline.read``, the source of ``Pipeline.run``)
against the pipeline's own configuration, name and root (no Spark: the check the pipeline
runs before anything is built). Oracle: the values the test configured."""

from __future__ import annotations

import pytest

from spark_ckpt.errors import ConfigError
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.spark.datasource.source_options import SourceOptions, check_pipeline_options
from spark_ckpt.spark.executors.routing import Router

CONFIG = CheckpointConfig.from_options(
    {
        "checkpoint.interval": "1s",
        "checkpoint.retained": "3",
        "restart-strategy": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": "2",
    }
)


def check(**options: object) -> None:
    check_pipeline_options(options, CONFIG, pipeline="orders", root="/lake/orders")


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"source": "generator", "channels": 4, "rate": 10.0},  # not the pipeline's business
        {"checkpoint.interval": "1s"},
        {"checkpoint.interval": "1000"},  # the same duration, spelled otherwise
        {"execution.checkpointing.interval": "1 s"},  # a Flink alias, same value
        {"CHECKPOINT.RETAINED": "3"},  # keys are case-insensitive
        {"restart-strategy": "fixed-delay", "restart-strategy.fixed-delay.attempts": 2},
        {"pipeline": "orders", "store": "/lake/orders/"},
    ],
)
def test_options_that_agree_with_the_pipeline_pass(options: dict[str, object]) -> None:
    check(**options)


@pytest.mark.parametrize(
    ("key", "value", "pipeline_value"),
    [
        ("checkpoint.interval", "5s", "'1s'"),
        ("execution.checkpointing.interval", "off", "'1s'"),
        ("checkpoint.retained", "1", "'3'"),
        ("state.checkpoints.num-retained", "9", "'3'"),
        ("restart-strategy", "none", "'fixed-delay'"),
        ("restart-strategy.fixed-delay.attempts", "7", "'2'"),
        ("restart-strategy.failure-rate.max-failures", "2", "restart-strategy is 'fixed-delay'"),
        ("checkpoint.storage", "/elsewhere", "unset"),
        ("savepoint.dir", "/lake/sp", "unset"),
    ],
)
def test_a_conflicting_checkpoint_option_names_both_values_and_where_to_set_it(
    key: str, value: str, pipeline_value: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        check(**{key: value})
    error = raised.value
    assert error.option == key and error.value == value
    message = str(error)
    for part in (repr(key), repr(value), pipeline_value, "CheckpointConfig", "Pipeline("):
        assert part in message, message


@pytest.mark.parametrize(
    ("key", "value", "accepted"),
    [
        ("checkpoint.interval", "abc", "duration"),
        ("checkpoint.retained", "0", ">= 1"),
        ("checkpoint.intervall", "1s", "a known option key"),
    ],
)
def test_an_invalid_value_gets_its_usual_error(key: str, value: str, accepted: str) -> None:
    with pytest.raises(ConfigError) as raised:
        check(**{key: value})
    assert raised.value.option == key and accepted in raised.value.accepted
    with pytest.raises(ConfigError) as usual:  # what the option gets without a pipeline
        CheckpointConfig.from_options({key: value})
    assert str(usual.value) == str(raised.value)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("pipeline", "other", "'orders'"),
        ("store", "/lake/other", "'/lake/orders'"),
        ("run", "x", ""),
        ("route.key", "user_id", "routes its rows itself"),
        ("Route.Parallelism", "4", "routes its rows itself"),
    ],
)
def test_the_pipelines_own_options_cannot_be_overridden(
    key: str, value: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        check(**{key: value})
    assert raised.value.option == key and expected in str(raised.value)


def test_routing_options_parse_into_the_router_they_came_from() -> None:
    router = Router("user_id", 3, 128, 2)
    parsed = SourceOptions.parse({"pipeline": "p", **router.options()})
    assert parsed.router == router
    assert SourceOptions.parse({"pipeline": "p"}).router is None


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"route.key": "user_id"}, "route.parallelism"),  # all or none
        (
            {
                "route.key": "k",
                "route.parallelism": "0",
                "route.maxParallelism": "8",
                "route.partitions": "2",
            },
            "route.parallelism",
        ),
        (
            {
                "route.key": "k",
                "route.parallelism": "9",
                "route.maxParallelism": "8",
                "route.partitions": "2",
            },
            "route.parallelism",
        ),
        (
            {
                "route.key": "k",
                "route.parallelism": "2",
                "route.maxParallelism": "x",
                "route.partitions": "2",
            },
            "route.maxParallelism",
        ),
    ],
)
def test_bad_routing_options_name_the_option(options: dict[str, str], option: str) -> None:
    with pytest.raises(ConfigError) as raised:
        SourceOptions.parse({"pipeline": "p", **options})
    assert raised.value.option == option
