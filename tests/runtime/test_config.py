"""CheckpointConfig: defaults, string options, builder, validation and round trips."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_ckpt.errors import ConfigError
from spark_ckpt.runtime.config import (
    CheckpointConfig,
    CheckpointingMode,
    ExternalizedCheckpointRetention,
    FailureRateRestart,
    FixedDelayRestart,
    NoRestart,
    RestartStrategies,
    RestartStrategy,
    days,
    format_duration,
    hours,
    milliseconds,
    minutes,
    parse_duration,
    parse_option,
    seconds,
)

# ------------------------------------------------------------------ defaults


def test_defaults_are_flinks() -> None:
    c = CheckpointConfig()
    # deviates from Flink (off): a checkpoint every second, in every entry point alike
    assert c.interval_ms == 1000 and c.periodic
    assert CheckpointConfig.from_options({}).interval_ms == 1000
    assert CheckpointConfig.builder().build().interval_ms == 1000
    assert CheckpointConfig.from_options({"checkpoint.interval": "off"}).interval_ms is None
    assert c.mode is CheckpointingMode.EXACTLY_ONCE and c.is_exactly_once
    assert c.timeout_ms == 10 * 60 * 1000
    assert c.min_pause_ms == 0
    assert c.max_concurrent == 1
    assert c.tolerable_failed_checkpoints == 0
    assert c.unaligned is False
    assert c.aligned_checkpoint_timeout_ms == 0 and not c.aligned_timeout_active
    assert c.retained_checkpoints == 1
    # deviates from Flink: checkpoints outlive a stopped job unless configured otherwise
    assert c.externalized_retention is ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION
    assert c.externalized
    assert c.checkpoint_storage is None and c.savepoint_dir is None
    assert c.restart_strategy == NoRestart()
    assert c.max_parallelism == 128


def test_empty_and_foreign_options_give_defaults() -> None:
    assert CheckpointConfig.from_options({}) == CheckpointConfig()
    foreign = {"path": "/tmp/x", "kafka.bootstrap.servers": "h:9092", "numPartitions": "3"}
    assert CheckpointConfig.from_options(foreign) == CheckpointConfig()


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("state.backend.type", "rocksdb", "rocksdb"),
        ("State.Backend.Type", "HashMap", "hashmap"),
        ("state.backend", "filesystem", "hashmap"),  # Flink's pre-1.13 names
        ("state.backend", "jobmanager", "hashmap"),
    ],
)
def test_the_state_backend_is_chosen_with_flink_keys(key: str, value: str, expected: str) -> None:
    config = CheckpointConfig.from_options({key: value})
    assert config.state_backend == expected
    assert config.state_backend_spec.type.value == expected
    assert CheckpointConfig.from_options(config.to_options()) == config


def test_rocksdb_options_parse_flink_memory_sizes() -> None:
    config = CheckpointConfig.from_options(
        {
            "state.backend.type": "rocksdb",
            "state.backend.rocksdb.localdir": "/tmp/x",
            "state.backend.rocksdb.block.cache-size": "16mb",
            "state.backend.rocksdb.writebuffer.size": "1 GB",
            "state.backend.rocksdb.writebuffer.count": "3",
        }
    )
    options = config.state_backend_spec.rocksdb
    assert options.local_dir == "/tmp/x"
    assert options.block_cache_bytes == 16 << 20 and options.write_buffer_bytes == 1 << 30
    assert options.max_write_buffers == 3
    assert CheckpointConfig.from_options(config.to_options()) == config


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("state.backend.type", "forst", "hashmap [|] rocksdb"),
        ("state.backend.rocksdb.block.cache-size", "lots", "memory size"),
        ("state.backend.rocksdb.block.cache-size", "0mb", "memory size"),
        ("State.Backend.Incremental", "true", "always incremental"),
    ],
)
def test_bad_state_backend_options_are_one_clear_error(key: str, value: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        CheckpointConfig.from_options({key: value})
    assert e.value.option == key
    with pytest.raises(ConfigError, match=match):
        parse_option(key, value)


# ------------------------------------------------------------------ durations


def test_duration_helpers() -> None:
    assert milliseconds(7) == 7
    assert seconds(3) == 3_000
    assert minutes(2) == 120_000
    assert hours(1) == 3_600_000
    assert days(1) == 86_400_000


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("0", 0),
        ("250", 250),
        ("500ms", 500),
        ("500 ms", 500),
        ("3 millis", 3),
        ("2 milliseconds", 2),
        ("10s", 10_000),
        ("10 S", 10_000),
        ("1sec", 1_000),
        ("4 secs", 4_000),
        ("1 second", 1_000),
        ("2seconds", 2_000),
        ("1min", 60_000),
        ("3m", 180_000),
        ("1 minute", 60_000),
        ("5 minutes", 300_000),
        ("2 h", 7_200_000),
        ("1hour", 3_600_000),
        ("3 hours", 10_800_000),
        ("1d", 86_400_000),
        ("1 day", 86_400_000),
        ("2 DAYS", 172_800_000),
        ("  7s  ", 7_000),
    ],
)
def test_parse_duration_forms(text: str, ms: int) -> None:
    assert parse_duration("opt", text) == ms


@pytest.mark.parametrize(
    "text", ["", "  ", "-1", "-5s", "1.5s", "s", "10 fortnights", "10s5", "ten", "1 s s", "1µs"]
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration("checkpoint.timeout", text)
    assert info.value.option == "checkpoint.timeout"
    assert "checkpoint.timeout" in str(info.value)
    assert repr(text) in str(info.value)


def test_parse_duration_rejects_beyond_long() -> None:
    with pytest.raises(ConfigError):
        parse_duration("x", f"{2**63}")
    assert parse_duration("x", f"{2**63 - 1}") == 2**63 - 1


@given(st.integers(0, 2**63 - 1))
def test_format_duration_round_trips(ms: int) -> None:
    assert parse_duration("x", format_duration(ms)) == ms


def test_format_duration_picks_largest_exact_unit() -> None:
    assert [format_duration(v) for v in (0, 1, 1500, 3000, 120_000, 7_200_000, 86_400_000)] == [
        "0ms",
        "1ms",
        "1500ms",
        "3s",
        "2min",
        "2h",
        "1d",
    ]


# ------------------------------------------------------------------ option forms


@pytest.mark.parametrize(
    ("options", "field", "value"),
    [
        ({"checkpoint.interval": "10s"}, "interval_ms", 10_000),
        ({"checkpoint.interval": "500"}, "interval_ms", 500),
        ({"checkpoint.interval": "off"}, "interval_ms", None),
        ({"checkpoint.interval": "NONE"}, "interval_ms", None),
        ({"execution.checkpointing.interval": "1min"}, "interval_ms", 60_000),
        ({"CHECKPOINT.Interval": "1d"}, "interval_ms", 86_400_000),
        ({"checkpoint.mode": "exactly_once"}, "mode", CheckpointingMode.EXACTLY_ONCE),
        ({"checkpoint.mode": "EXACTLY_ONCE"}, "mode", CheckpointingMode.EXACTLY_ONCE),
        ({"checkpoint.mode": "exactly-once"}, "mode", CheckpointingMode.EXACTLY_ONCE),
        ({"checkpoint.mode": "at_least_once"}, "mode", CheckpointingMode.AT_LEAST_ONCE),
        ({"checkpoint.mode": "At-Least-Once"}, "mode", CheckpointingMode.AT_LEAST_ONCE),
        ({"execution.checkpointing.mode": "AT_LEAST_ONCE"}, "mode",
         CheckpointingMode.AT_LEAST_ONCE),
        ({"checkpoint.timeout": "30s"}, "timeout_ms", 30_000),
        ({"execution.checkpointing.timeout": "1 h"}, "timeout_ms", 3_600_000),
        ({"checkpoint.min-pause": "3s"}, "min_pause_ms", 3_000),
        ({"execution.checkpointing.min-pause": "0"}, "min_pause_ms", 0),
        ({"checkpoint.max-concurrent": "1"}, "max_concurrent", 1),
        ({"execution.checkpointing.max-concurrent-checkpoints": " 4 "}, "max_concurrent", 4),
        ({"checkpoint.tolerable-failures": "3"}, "tolerable_failed_checkpoints", 3),
        ({"execution.checkpointing.tolerable-failed-checkpoints": "0"},
         "tolerable_failed_checkpoints", 0),
        ({"checkpoint.unaligned": "true"}, "unaligned", True),
        ({"checkpoint.unaligned": "TRUE"}, "unaligned", True),
        ({"checkpoint.unaligned": "Yes"}, "unaligned", True),
        ({"checkpoint.unaligned": "1"}, "unaligned", True),
        ({"checkpoint.unaligned": "false"}, "unaligned", False),
        ({"checkpoint.unaligned": "no"}, "unaligned", False),
        ({"checkpoint.unaligned": "0"}, "unaligned", False),
        ({"execution.checkpointing.unaligned": "true"}, "unaligned", True),
        ({"execution.checkpointing.unaligned.enabled": "true"}, "unaligned", True),
        ({"checkpoint.aligned-timeout": "5s"}, "aligned_checkpoint_timeout_ms", 5_000),
        ({"execution.checkpointing.aligned-checkpoint-timeout": "0"},
         "aligned_checkpoint_timeout_ms", 0),
        ({"checkpoint.retained": "3"}, "retained_checkpoints", 3),
        ({"execution.checkpointing.num-retained": "2"}, "retained_checkpoints", 2),
        ({"state.checkpoints.num-retained": "5"}, "retained_checkpoints", 5),
        ({"checkpoint.externalized-retention": "retain_on_cancellation"},
         "externalized_retention", ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION),
        ({"checkpoint.externalized-retention": "Delete-On-Cancellation"},
         "externalized_retention", ExternalizedCheckpointRetention.DELETE_ON_CANCELLATION),
        ({"execution.checkpointing.externalized-checkpoint-retention":
          "NO_EXTERNALIZED_CHECKPOINTS"},
         "externalized_retention", ExternalizedCheckpointRetention.NO_EXTERNALIZED_CHECKPOINTS),
        ({"checkpoint.storage": "/lake/ck"}, "checkpoint_storage", "/lake/ck"),
        ({"execution.checkpointing.dir": "s3://b/ck"}, "checkpoint_storage", "s3://b/ck"),
        ({"state.checkpoints.dir": "file:///ck"}, "checkpoint_storage", "file:///ck"),
        ({"savepoint.dir": "/lake/sp"}, "savepoint_dir", "/lake/sp"),
        ({"execution.checkpointing.savepoint-dir": "/sp"}, "savepoint_dir", "/sp"),
        ({"state.savepoints.dir": "/sp2"}, "savepoint_dir", "/sp2"),
        ({"state.max-parallelism": "4096"}, "max_parallelism", 4096),
        ({"pipeline.max-parallelism": "32768"}, "max_parallelism", 32768),
    ],
)  # fmt: skip
def test_option_forms(options: dict[str, str], field: str, value: object) -> None:
    config = CheckpointConfig.from_options(options)
    assert getattr(config, field) == value
    # Every other field keeps its default.
    default = CheckpointConfig()
    for other in CheckpointConfig.__dataclass_fields__:
        if other != field:
            assert getattr(config, other) == getattr(default, other)


@pytest.mark.parametrize(
    ("options", "strategy"),
    [
        ({"restart-strategy": "none"}, NoRestart()),
        ({"restart-strategy": "OFF"}, NoRestart()),
        ({"restart-strategy.type": "disable"}, NoRestart()),
        ({"restart-strategy": "fixed-delay"}, FixedDelayRestart(1, 1_000)),
        ({"restart-strategy": "fixed_delay", "restart-strategy.fixed-delay.attempts": "3",
          "restart-strategy.fixed-delay.delay": "10 s"}, FixedDelayRestart(3, 10_000)),
        ({"restart-strategy.type": "fixeddelay",
          "restart-strategy.fixed-delay.attempts": "0"}, FixedDelayRestart(0, 1_000)),
        ({"restart-strategy": "failure-rate"}, FailureRateRestart(1, 60_000, 1_000)),
        ({"restart-strategy": "Failure-Rate",
          "restart-strategy.failure-rate.max-failures": "3",
          "restart-strategy.failure-rate.interval": "1d",
          "restart-strategy.failure-rate.delay": "1min"},
         FailureRateRestart(3, 86_400_000, 60_000)),
        ({"restart-strategy": "failurerate",
          "restart-strategy.failure-rate.max-failures-per-interval": "2",
          "restart-strategy.failure-rate.failure-rate-interval": "5 min"},
         FailureRateRestart(2, 300_000, 1_000)),
    ],
)  # fmt: skip
def test_restart_strategy_options(options: dict[str, str], strategy: RestartStrategy) -> None:
    assert CheckpointConfig.from_options(options).restart_strategy == strategy


def test_agreeing_spellings_are_accepted() -> None:
    opts = {"checkpoint.interval": "3s", "execution.checkpointing.interval": "3000"}
    assert CheckpointConfig.from_options(opts).interval_ms == 3_000


# ------------------------------------------------------------------ invalid options


@pytest.mark.parametrize(
    ("options", "bad_key"),
    [
        ({"checkpoint.interval": "5ms"}, "checkpoint.interval"),
        ({"checkpoint.interval": "9"}, "checkpoint.interval"),
        ({"checkpoint.interval": "0"}, "checkpoint.interval"),
        ({"checkpoint.interval": "-1"}, "checkpoint.interval"),
        ({"checkpoint.interval": "soon"}, "checkpoint.interval"),
        ({"execution.checkpointing.interval": "1 week"}, "execution.checkpointing.interval"),
        ({"checkpoint.mode": "twice"}, "checkpoint.mode"),
        ({"checkpoint.timeout": "0"}, "checkpoint.timeout"),
        ({"checkpoint.timeout": ""}, "checkpoint.timeout"),
        ({"checkpoint.min-pause": "-3s"}, "checkpoint.min-pause"),
        ({"checkpoint.max-concurrent": "0"}, "checkpoint.max-concurrent"),
        ({"checkpoint.max-concurrent": "two"}, "checkpoint.max-concurrent"),
        ({"execution.checkpointing.max-concurrent-checkpoints": "0"},
         "execution.checkpointing.max-concurrent-checkpoints"),
        ({"checkpoint.tolerable-failures": "-1"}, "checkpoint.tolerable-failures"),
        ({"checkpoint.tolerable-failures": "1.0"}, "checkpoint.tolerable-failures"),
        ({"checkpoint.unaligned": "maybe"}, "checkpoint.unaligned"),
        ({"checkpoint.aligned-timeout": "-1"}, "checkpoint.aligned-timeout"),
        ({"checkpoint.retained": "0"}, "checkpoint.retained"),
        ({"state.checkpoints.num-retained": "0"}, "state.checkpoints.num-retained"),
        ({"checkpoint.externalized-retention": "keep"}, "checkpoint.externalized-retention"),
        ({"checkpoint.storage": "  "}, "checkpoint.storage"),
        ({"savepoint.dir": ""}, "savepoint.dir"),
        ({"state.max-parallelism": "0"}, "state.max-parallelism"),
        ({"state.max-parallelism": "32769"}, "state.max-parallelism"),
        ({"restart-strategy": "exponential-delay"}, "restart-strategy"),
        ({"restart-strategy": "fixed-delay", "restart-strategy.fixed-delay.attempts": "-1"},
         "restart-strategy.fixed-delay.attempts"),
        ({"restart-strategy": "fixed-delay", "restart-strategy.fixed-delay.delay": "-1s"},
         "restart-strategy.fixed-delay.delay"),
        ({"restart-strategy": "failure-rate", "restart-strategy.failure-rate.max-failures": "0"},
         "restart-strategy.failure-rate.max-failures"),
        ({"restart-strategy": "failure-rate", "restart-strategy.failure-rate.interval": "0"},
         "restart-strategy.failure-rate.interval"),
        ({"restart-strategy": "failure-rate", "restart-strategy.failure-rate.delay": "x"},
         "restart-strategy.failure-rate.delay"),
        # sub-options of a strategy that is not selected
        ({"restart-strategy.fixed-delay.attempts": "3"}, "restart-strategy.fixed-delay.attempts"),
        ({"restart-strategy": "failure-rate", "restart-strategy.fixed-delay.delay": "1s"},
         "restart-strategy.fixed-delay.delay"),
        # cross-field rules
        ({"checkpoint.unaligned": "true", "checkpoint.mode": "at_least_once"},
         "checkpoint.unaligned"),
        ({"checkpoint.unaligned": "true", "checkpoint.max-concurrent": "2"},
         "checkpoint.unaligned"),
        # typos inside reserved namespaces
        ({"checkpoint.intervall": "10s"}, "checkpoint.intervall"),
        ({"savepoint.directory": "/x"}, "savepoint.directory"),
        ({"restart-strategy.fixed-delay.attempt": "1", "restart-strategy": "fixed-delay"},
         "restart-strategy.fixed-delay.attempt"),
        ({"state.max_parallelism": "4"}, "state.max_parallelism"),
        ({"execution.checkpointing.intervall": "1s"}, "execution.checkpointing.intervall"),
        # conflicting spellings of one option
        ({"checkpoint.interval": "1s", "execution.checkpointing.interval": "2s"},
         "execution.checkpointing.interval"),
    ],
)  # fmt: skip
def test_invalid_options_name_the_key(options: dict[str, str], bad_key: str) -> None:
    with pytest.raises(ConfigError) as info:
        CheckpointConfig.from_options(options)
    assert info.value.option == bad_key
    message = str(info.value)
    assert repr(bad_key) in message
    assert repr(options[bad_key]) in message
    assert "expected" in message


def test_unknown_key_message_lists_known_keys() -> None:
    with pytest.raises(ConfigError) as info:
        CheckpointConfig.from_options({"checkpoint.intervall": "10s"})
    assert "checkpoint.interval" in info.value.accepted
    assert "restart-strategy.failure-rate.max-failures" in info.value.accepted


# ------------------------------------------------------------------ constructor validation


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"interval_ms": 9}, "interval_ms"),
        ({"interval_ms": 0}, "interval_ms"),
        ({"interval_ms": True}, "interval_ms"),
        ({"interval_ms": 10.0}, "interval_ms"),
        ({"mode": "EXACTLY_ONCE"}, "mode"),
        ({"timeout_ms": 0}, "timeout_ms"),
        ({"min_pause_ms": -1}, "min_pause_ms"),
        ({"max_concurrent": 0}, "max_concurrent"),
        ({"tolerable_failed_checkpoints": -1}, "tolerable_failed_checkpoints"),
        ({"unaligned": 1}, "unaligned"),
        ({"aligned_checkpoint_timeout_ms": -1}, "aligned_checkpoint_timeout_ms"),
        ({"retained_checkpoints": 0}, "retained_checkpoints"),
        ({"externalized_retention": "RETAIN_ON_CANCELLATION"}, "externalized_retention"),
        ({"checkpoint_storage": ""}, "checkpoint_storage"),
        ({"savepoint_dir": " "}, "savepoint_dir"),
        ({"restart_strategy": "none"}, "restart_strategy"),
        ({"max_parallelism": 0}, "max_parallelism"),
        ({"max_parallelism": 32769}, "max_parallelism"),
        ({"unaligned": True, "mode": CheckpointingMode.AT_LEAST_ONCE}, "unaligned"),
        ({"unaligned": True, "max_concurrent": 2}, "unaligned"),
    ],
)
def test_constructor_rejects(kwargs: dict[str, Any], option: str) -> None:
    with pytest.raises(ConfigError) as info:
        CheckpointConfig(**kwargs)
    assert info.value.option == option
    assert repr(option) in str(info.value)


def test_boundaries_accepted() -> None:
    c = CheckpointConfig(
        interval_ms=10,
        timeout_ms=1,
        max_parallelism=32768,
        unaligned=True,
        aligned_checkpoint_timeout_ms=1,
    )
    assert c.aligned_timeout_active
    assert CheckpointConfig(max_parallelism=1).max_parallelism == 1


# ------------------------------------------------------------------ builder


def _flink_example_builder() -> CheckpointConfig:
    return (
        CheckpointConfig.builder()
        .enable_checkpointing(3000, CheckpointingMode.EXACTLY_ONCE)
        .set_checkpoint_timeout(30_000)
        .set_min_pause_between_checkpoints(3000)
        .enable_externalized_checkpoints(ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION)
        .set_restart_strategy(RestartStrategies.failure_rate_restart(3, days(1), minutes(1)))
        .set_checkpoint_storage("/lake/ck")
        .build()
    )


def test_builder_equals_options_for_flink_example() -> None:
    from_options = CheckpointConfig.from_options(
        {
            "checkpoint.interval": "3s",
            "checkpoint.mode": "exactly_once",
            "checkpoint.timeout": "30s",
            "checkpoint.min-pause": "3000",
            "checkpoint.externalized-retention": "retain_on_cancellation",
            "restart-strategy": "failure-rate",
            "restart-strategy.failure-rate.max-failures": "3",
            "restart-strategy.failure-rate.interval": "1 d",
            "restart-strategy.failure-rate.delay": "1min",
            "checkpoint.storage": "/lake/ck",
            "path": "/some/table",  # another subsystem's option
        }
    )
    built = _flink_example_builder()
    assert built == from_options
    # Independent of both: the fields spelled out by hand.
    assert built == CheckpointConfig(
        interval_ms=3000,
        timeout_ms=30_000,
        min_pause_ms=3000,
        externalized_retention=ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION,
        restart_strategy=FailureRateRestart(3, 86_400_000, 60_000),
        checkpoint_storage="/lake/ck",
    )
    assert built.externalized and built.periodic


def test_builder_has_a_setter_for_every_field() -> None:
    built = (
        CheckpointConfig.builder()
        .enable_checkpointing(100)
        .set_checkpointing_mode(CheckpointingMode.EXACTLY_ONCE)
        .set_checkpoint_timeout(5)
        .set_min_pause_between_checkpoints(6)
        .set_max_concurrent_checkpoints(1)
        .set_tolerable_checkpoint_failure_number(7)
        .enable_unaligned_checkpoints()
        .set_aligned_checkpoint_timeout(8)
        .set_num_retained_checkpoints(9)
        .enable_externalized_checkpoints(ExternalizedCheckpointRetention.DELETE_ON_CANCELLATION)
        .set_checkpoint_storage("/ck")
        .set_savepoint_dir("/sp")
        .set_restart_strategy(RestartStrategies.fixed_delay_restart(4, seconds(2)))
        .set_max_parallelism(256)
        .build()
    )
    assert built == CheckpointConfig(
        interval_ms=100,
        timeout_ms=5,
        min_pause_ms=6,
        tolerable_failed_checkpoints=7,
        unaligned=True,
        aligned_checkpoint_timeout_ms=8,
        retained_checkpoints=9,
        externalized_retention=ExternalizedCheckpointRetention.DELETE_ON_CANCELLATION,
        checkpoint_storage="/ck",
        savepoint_dir="/sp",
        restart_strategy=FixedDelayRestart(4, 2000),
        max_parallelism=256,
    )
    assert built.to_builder().enable_unaligned_checkpoints(False).build().unaligned is False
    assert built.to_builder().disable_checkpointing().build().interval_ms is None


def test_builder_validates_on_build() -> None:
    builder = CheckpointConfig.builder().enable_checkpointing(5)
    with pytest.raises(ConfigError) as info:
        builder.build()
    assert info.value.option == "interval_ms"
    builder = (
        CheckpointConfig.builder()
        .enable_checkpointing(1000, CheckpointingMode.AT_LEAST_ONCE)
        .enable_unaligned_checkpoints()
    )
    with pytest.raises(ConfigError, match="unaligned"):
        builder.build()


def test_builder_is_reusable_and_builds_independent_values() -> None:
    builder = CheckpointConfig.builder().enable_checkpointing(1000)
    first = builder.build()
    second = builder.set_checkpoint_timeout(2000).build()
    assert first.timeout_ms == 600_000 and second.timeout_ms == 2000


# ------------------------------------------------------------------ round trips


@st.composite
def configs(draw: st.DrawFn) -> CheckpointConfig:
    unaligned = draw(st.booleans())
    mode = CheckpointingMode.EXACTLY_ONCE if unaligned else draw(st.sampled_from(CheckpointingMode))
    durations = st.integers(0, 2**63 - 1)
    paths = st.none() | st.text(min_size=1).filter(lambda s: s.strip() != "")
    strategy = draw(
        st.one_of(
            st.just(NoRestart()),
            st.builds(FixedDelayRestart, st.integers(0, 2**31), durations),
            st.builds(
                FailureRateRestart, st.integers(1, 2**31), st.integers(1, 2**63 - 1), durations
            ),
        )
    )
    return CheckpointConfig(
        interval_ms=draw(st.none() | st.integers(10, 2**63 - 1)),
        mode=mode,
        timeout_ms=draw(st.integers(1, 2**63 - 1)),
        min_pause_ms=draw(durations),
        max_concurrent=1 if unaligned else draw(st.integers(1, 2**31)),
        tolerable_failed_checkpoints=draw(st.integers(0, 2**31)),
        unaligned=unaligned,
        aligned_checkpoint_timeout_ms=draw(durations),
        retained_checkpoints=draw(st.integers(1, 2**31)),
        externalized_retention=draw(st.sampled_from(ExternalizedCheckpointRetention)),
        checkpoint_storage=draw(paths),
        savepoint_dir=draw(paths),
        restart_strategy=strategy,
        max_parallelism=draw(st.integers(1, 32768)),
    )


@given(configs())
def test_options_round_trip(config: CheckpointConfig) -> None:
    options = config.to_options()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in options.items())
    assert CheckpointConfig.from_options(options) == config


@given(configs())
def test_json_round_trip(config: CheckpointConfig) -> None:
    encoded = json.dumps(config.to_dict())
    assert CheckpointConfig.from_dict(json.loads(encoded)) == config


def test_to_dict_shape() -> None:
    d = _flink_example_builder().to_dict()
    assert d["mode"] == "EXACTLY_ONCE"
    assert d["externalized_retention"] == "RETAIN_ON_CANCELLATION"
    assert d["restart_strategy"] == {
        "type": "failure-rate",
        "max_failures_per_interval": 3,
        "failure_interval_ms": 86_400_000,
        "delay_ms": 60_000,
    }
    assert d["interval_ms"] == 3000 and d["savepoint_dir"] is None


def test_from_dict_missing_keys_default_and_rejects_bad_input() -> None:
    assert CheckpointConfig.from_dict({}) == CheckpointConfig()
    assert CheckpointConfig.from_dict({"interval_ms": 50}).interval_ms == 50
    for bad, option in (
        ({"interval": 50}, "interval"),
        ({"mode": "SOMETIMES"}, "mode"),
        ({"externalized_retention": "KEEP"}, "externalized_retention"),
        ({"timeout_ms": "10s"}, "timeout_ms"),
        ({"restart_strategy": {"type": "nope"}}, "type"),
    ):
        with pytest.raises(ConfigError) as info:
            CheckpointConfig.from_dict(bad)
        assert info.value.option == option
