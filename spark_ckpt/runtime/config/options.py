"""The option table: every key (Flink's spellings too), how its value parses and renders, and
the :class:`~spark_ckpt.runtime.config.checkpoint_config.CheckpointConfig` field it sets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from spark_ckpt.errors import ConfigError
from spark_ckpt.protocol.option import parse_int
from spark_ckpt.runtime.config.durations import format_duration, parse_duration
from spark_ckpt.runtime.config.modes import CheckpointingMode, ExternalizedCheckpointRetention
from spark_ckpt.runtime.config.values import (
    enum_parser,
    format_memory_size,
    parse_bool,
    parse_interval,
    parse_memory_size,
    parse_path,
    parse_restart_type,
    parse_state_backend,
)


@dataclass(frozen=True)
class Option:
    key: str  # canonical key
    aliases: tuple[str, ...]
    parse: Callable[[str, str], object]
    render: Callable[[Any], str]
    target: str  # CheckpointConfig field, or the restart strategy's field


def render_str(value: Any) -> str:
    return str(value)


def render_enum(value: Any) -> str:
    return str(value.name.lower())


def render_bool(value: Any) -> str:
    return "true" if value else "false"


def render_interval(value: Any) -> str:
    return "off" if value is None else format_duration(value)


OPTIONS: Final[tuple[Option, ...]] = (
    Option(
        "checkpoint.interval",
        ("execution.checkpointing.interval",),
        parse_interval,
        render_interval,
        "interval_ms",
    ),
    Option(
        "checkpoint.mode",
        ("execution.checkpointing.mode",),
        enum_parser(CheckpointingMode),
        render_enum,
        "mode",
    ),
    Option(
        "checkpoint.timeout",
        ("execution.checkpointing.timeout",),
        parse_duration,
        format_duration,
        "timeout_ms",
    ),
    Option(
        "checkpoint.min-pause",
        ("execution.checkpointing.min-pause",),
        parse_duration,
        format_duration,
        "min_pause_ms",
    ),
    Option(
        "checkpoint.max-concurrent",
        ("execution.checkpointing.max-concurrent-checkpoints",),
        parse_int,
        render_str,
        "max_concurrent",
    ),
    Option(
        "checkpoint.tolerable-failures",
        ("execution.checkpointing.tolerable-failed-checkpoints",),
        parse_int,
        render_str,
        "tolerable_failed_checkpoints",
    ),
    Option(
        "checkpoint.unaligned",
        ("execution.checkpointing.unaligned", "execution.checkpointing.unaligned.enabled"),
        parse_bool,
        render_bool,
        "unaligned",
    ),
    Option(
        "checkpoint.aligned-timeout",
        ("execution.checkpointing.aligned-checkpoint-timeout",),
        parse_duration,
        format_duration,
        "aligned_checkpoint_timeout_ms",
    ),
    Option(
        "checkpoint.retained",
        ("execution.checkpointing.num-retained", "state.checkpoints.num-retained"),
        parse_int,
        render_str,
        "retained_checkpoints",
    ),
    Option(
        "checkpoint.history",
        ("web.checkpoints.history",),
        parse_int,
        render_str,
        "history_size",
    ),
    Option(
        "checkpoint.externalized-retention",
        ("execution.checkpointing.externalized-checkpoint-retention",),
        enum_parser(ExternalizedCheckpointRetention),
        render_enum,
        "externalized_retention",
    ),
    Option(
        "checkpoint.storage",
        ("execution.checkpointing.dir", "state.checkpoints.dir"),
        parse_path,
        render_str,
        "checkpoint_storage",
    ),
    Option(
        "savepoint.dir",
        ("execution.checkpointing.savepoint-dir", "state.savepoints.dir"),
        parse_path,
        render_str,
        "savepoint_dir",
    ),
    Option(
        "state.max-parallelism",
        ("pipeline.max-parallelism",),
        parse_int,
        render_str,
        "max_parallelism",
    ),
    Option(
        "state.backend.type",
        ("state.backend",),
        parse_state_backend,
        render_str,
        "state_backend",
    ),
    Option(
        "state.backend.rocksdb.localdir",
        ("state.backend.rocksdb.local-dir",),
        parse_path,
        render_str,
        "rocksdb_local_dir",
    ),
    Option(
        "state.backend.rocksdb.block.cache-size",
        (),
        parse_memory_size,
        format_memory_size,
        "rocksdb_block_cache_bytes",
    ),
    Option(
        "state.backend.rocksdb.writebuffer.size",
        (),
        parse_memory_size,
        format_memory_size,
        "rocksdb_write_buffer_bytes",
    ),
    Option(
        "state.backend.rocksdb.writebuffer.count",
        (),
        parse_int,
        render_str,
        "rocksdb_write_buffer_count",
    ),
    Option(
        "restart-strategy",
        ("restart-strategy.type",),
        parse_restart_type,
        render_str,
        "restart_strategy",
    ),
    Option(
        "restart-strategy.fixed-delay.attempts",
        (),
        parse_int,
        render_str,
        "fixed-delay.attempts",
    ),
    Option(
        "restart-strategy.fixed-delay.delay",
        (),
        parse_duration,
        format_duration,
        "fixed-delay.delay_ms",
    ),
    Option(
        "restart-strategy.failure-rate.max-failures",
        ("restart-strategy.failure-rate.max-failures-per-interval",),
        parse_int,
        render_str,
        "failure-rate.max_failures_per_interval",
    ),
    Option(
        "restart-strategy.failure-rate.interval",
        ("restart-strategy.failure-rate.failure-rate-interval",),
        parse_duration,
        format_duration,
        "failure-rate.failure_interval_ms",
    ),
    Option(
        "restart-strategy.failure-rate.delay",
        (),
        parse_duration,
        format_duration,
        "failure-rate.delay_ms",
    ),
)

#: Every accepted spelling (lower case) -> its option.
BY_KEY: Final[dict[str, Option]] = {k: o for o in OPTIONS for k in (o.key, *o.aliases)}
BY_TARGET: Final[dict[str, Option]] = {o.target: o for o in OPTIONS}

#: Namespaces this module owns: an unknown key starting with one of these is an error.
RESERVED_PREFIXES: Final = (
    "checkpoint.",
    "savepoint.",
    "restart-strategy",
    "state.",
    "execution.checkpointing.",
)
#: Flink's state backend options: those in :data:`OPTIONS` are spark-ckpt's too; any other
#: key under this prefix is refused with what spark-ckpt does instead (see :func:`unknown_key`).
STATE_BACKEND_PREFIX: Final = "state.backend"

#: Flink's defaults for the parameters of a restart strategy chosen by type only.
RESTART_DEFAULTS: Final[dict[str, dict[str, int]]] = {
    "fixed-delay": {"attempts": 1, "delay_ms": 1000},
    "failure-rate": {
        "max_failures_per_interval": 1,
        "failure_interval_ms": 60_000,
        "delay_ms": 1000,
    },
}


def known_keys() -> str:
    return ", ".join(sorted(o.key for o in OPTIONS)) + " (or their Flink spellings)"


def unknown_key(key: str, value: object) -> ConfigError:
    """The error for *key*, inside the reserved namespaces but no option."""
    if key.strip().lower().startswith(STATE_BACKEND_PREFIX):
        return ConfigError(
            key,
            value,
            "a state backend option spark-ckpt has: state.backend.type (hashmap | rocksdb), "
            "state.backend.rocksdb.localdir, state.backend.rocksdb.block.cache-size, "
            "state.backend.rocksdb.writebuffer.size or state.backend.rocksdb.writebuffer.count "
            "(checkpoints are always incremental, on both backends)",
        )
    return ConfigError(key, value, f"a known option key: {known_keys()}")


def parse_option(key: str, value: str) -> tuple[str, object] | None:
    """The canonical key of the option spelled *key* (any case, Flink aliases) and *value*
    parsed as :meth:`CheckpointConfig.from_options` parses it; ``None`` when *key* is outside
    the reserved namespaces. An unknown key inside them (``state.backend…`` too) or an invalid
    value raises the :class:`ConfigError` ``from_options`` would."""
    lowered = key.strip().lower()
    option = BY_KEY.get(lowered)
    if option is None:
        if lowered.startswith(RESERVED_PREFIXES):
            raise unknown_key(key, value)
        return None
    return option.key, option.parse(key, value)
