"""The :class:`CheckpointConfig` value, its validation and its JSON and option forms."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Final

from spark_ckpt.errors import ConfigError
from spark_ckpt.protocol.option import check_int
from spark_ckpt.runtime.config.modes import (
    DEFAULT_INTERVAL_MS,
    MAX_MAX_PARALLELISM,
    MIN_INTERVAL_MS,
    CheckpointingMode,
    ExternalizedCheckpointRetention,
)
from spark_ckpt.runtime.config.options import (
    BY_KEY,
    BY_TARGET,
    RESERVED_PREFIXES,
    RESTART_DEFAULTS,
    unknown_key,
)
from spark_ckpt.runtime.restart import (
    FailureRateRestart,
    FixedDelayRestart,
    NoRestart,
    RestartStrategy,
    restart_strategy_from_dict,
)
from spark_ckpt.state.backends.rocksdb import (
    DEFAULT_BLOCK_CACHE_BYTES,
    DEFAULT_MAX_WRITE_BUFFERS,
    DEFAULT_WRITE_BUFFER_BYTES,
    RocksDBOptions,
)
from spark_ckpt.state.backends.spec import StateBackendSpec, StateBackendType
from spark_ckpt.storage.history import DEFAULT_HISTORY_SIZE


@dataclass(frozen=True)
class CheckpointConfig:
    """Flink's checkpoint options (durations in ms). Defaults are Flink's, except
    ``interval_ms`` (:data:`DEFAULT_INTERVAL_MS`, Flink: off), ``externalized_retention`` and
    ``history_size`` (100, Flink: 10).

    ``interval_ms`` None disables periodic checkpoints (savepoints can still be taken).
    ``aligned_checkpoint_timeout_ms`` only applies with ``unaligned``: an aligned checkpoint
    still aligning after that long switches to unaligned (0 = never, start unaligned).
    ``retained_checkpoints`` is how many completed checkpoints the store keeps (savepoints are
    never removed by retention). ``max_parallelism`` is the number of key groups; it may not
    change across a restore.

    Validation (in ``__post_init__``) raises :class:`ConfigError` naming the field.
    """

    #: Unlike Flink (off), periodic checkpoints every second by default: output committed
    #: at checkpoints (``ckpt-sink``, the aligner's Delta output) needs them to appear.
    interval_ms: int | None = DEFAULT_INTERVAL_MS
    mode: CheckpointingMode = CheckpointingMode.EXACTLY_ONCE
    timeout_ms: int = 600_000
    min_pause_ms: int = 0
    max_concurrent: int = 1
    tolerable_failed_checkpoints: int = 0
    unaligned: bool = False
    aligned_checkpoint_timeout_ms: int = 0
    retained_checkpoints: int = 1
    #: How many finished checkpoints (completed or failed, savepoints too) the statistics
    #: history in the store keeps, whatever ``retained_checkpoints`` is (Flink's
    #: ``web.checkpoints.history``, default 10 there; see :mod:`spark_ckpt.storage.history`).
    history_size: int = DEFAULT_HISTORY_SIZE
    #: Unlike Flink (``NO_EXTERNALIZED_CHECKPOINTS``), checkpoints outlive a stopped job by
    #: default: a Spark user expects a restarted query to resume where it stopped, and a
    #: stop that deleted the checkpoints would make the next run re-emit committed output.
    externalized_retention: ExternalizedCheckpointRetention = (
        ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION
    )
    checkpoint_storage: str | None = None
    savepoint_dir: str | None = None
    restart_strategy: RestartStrategy = field(default_factory=NoRestart)
    max_parallelism: int = 128
    #: Where the subtasks keep their keyed state (Flink's ``state.backend.type``):
    #: ``hashmap`` (in memory) or ``rocksdb`` (embedded, on the local disk). Checkpoints of
    #: either restore on the other.
    state_backend: str = "hashmap"
    #: ``rocksdb``: the parent directory of its local files (None: the executor's
    #: ``spark.local.dir``, or the temporary directory), the block cache and the write
    #: buffers of each subtask's instance
    rocksdb_local_dir: str | None = None
    rocksdb_block_cache_bytes: int = DEFAULT_BLOCK_CACHE_BYTES
    rocksdb_write_buffer_bytes: int = DEFAULT_WRITE_BUFFER_BYTES
    rocksdb_write_buffer_count: int = DEFAULT_MAX_WRITE_BUFFERS

    def __post_init__(self) -> None:
        if self.interval_ms is not None:
            check_int("interval_ms", self.interval_ms, MIN_INTERVAL_MS, unit="milliseconds")
        if not isinstance(self.mode, CheckpointingMode):
            raise ConfigError("mode", self.mode, "a CheckpointingMode")
        check_int("timeout_ms", self.timeout_ms, 1, unit="milliseconds")
        check_int("min_pause_ms", self.min_pause_ms, 0, unit="milliseconds")
        check_int("max_concurrent", self.max_concurrent, 1)
        check_int("tolerable_failed_checkpoints", self.tolerable_failed_checkpoints, 0)
        if not isinstance(self.unaligned, bool):
            raise ConfigError("unaligned", self.unaligned, "a bool")
        check_int(
            "aligned_checkpoint_timeout_ms",
            self.aligned_checkpoint_timeout_ms,
            0,
            unit="milliseconds",
        )
        check_int("retained_checkpoints", self.retained_checkpoints, 1)
        check_int("history_size", self.history_size, 1)
        if not isinstance(self.externalized_retention, ExternalizedCheckpointRetention):
            raise ConfigError(
                "externalized_retention",
                self.externalized_retention,
                "an ExternalizedCheckpointRetention",
            )
        for name in ("checkpoint_storage", "savepoint_dir"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigError(name, value, "None or a non-empty path or URI")
        if not isinstance(
            self.restart_strategy, NoRestart | FixedDelayRestart | FailureRateRestart
        ):
            raise ConfigError(
                "restart_strategy",
                self.restart_strategy,
                "NoRestart, FixedDelayRestart or FailureRateRestart",
            )
        check_int("max_parallelism", self.max_parallelism, 1, MAX_MAX_PARALLELISM)
        if self.state_backend not in {t.value for t in StateBackendType}:
            raise ConfigError("state_backend", self.state_backend, "hashmap | rocksdb")
        if self.rocksdb_local_dir is not None and (
            not isinstance(self.rocksdb_local_dir, str) or not self.rocksdb_local_dir.strip()
        ):
            raise ConfigError("rocksdb_local_dir", self.rocksdb_local_dir, "None or a path")
        check_int("rocksdb_block_cache_bytes", self.rocksdb_block_cache_bytes, 1, unit="bytes")
        check_int("rocksdb_write_buffer_bytes", self.rocksdb_write_buffer_bytes, 1, unit="bytes")
        check_int("rocksdb_write_buffer_count", self.rocksdb_write_buffer_count, 1)
        if self.unaligned and self.mode is not CheckpointingMode.EXACTLY_ONCE:
            raise ConfigError(
                "unaligned",
                self.unaligned,
                "false when mode is AT_LEAST_ONCE (unaligned checkpoints need EXACTLY_ONCE)",
            )
        if self.unaligned and self.max_concurrent > 1:
            raise ConfigError(
                "unaligned",
                self.unaligned,
                f"false when max_concurrent is {self.max_concurrent} "
                "(unaligned checkpoints are not supported with concurrent checkpoints)",
            )

    # ------------------------------------------------------------------ derived properties

    @property
    def state_backend_spec(self) -> StateBackendSpec:
        """The state backend the subtasks are built with (picklable)."""
        return StateBackendSpec(
            StateBackendType(self.state_backend),
            RocksDBOptions(
                self.rocksdb_local_dir,
                self.rocksdb_block_cache_bytes,
                self.rocksdb_write_buffer_bytes,
                self.rocksdb_write_buffer_count,
            ),
        )

    @property
    def periodic(self) -> bool:
        """Whether periodic checkpoints are enabled."""
        return self.interval_ms is not None

    @property
    def is_exactly_once(self) -> bool:
        return self.mode is CheckpointingMode.EXACTLY_ONCE

    @property
    def externalized(self) -> bool:
        """Whether retained checkpoints outlive the job (cancelled or failed)."""
        return self.externalized_retention is not (
            ExternalizedCheckpointRetention.NO_EXTERNALIZED_CHECKPOINTS
        )

    @property
    def aligned_timeout_active(self) -> bool:
        """Whether aligned checkpoints switch to unaligned after
        ``aligned_checkpoint_timeout_ms``."""
        return self.unaligned and self.aligned_checkpoint_timeout_ms > 0

    # ------------------------------------------------------------------ string options

    @staticmethod
    def from_options(options: Mapping[str, str]) -> CheckpointConfig:
        """Build a config from string options (the keys: ``docs/architecture.md``, *Checkpoint
        options*).

        Keys are case-insensitive; keys outside the reserved namespaces are ignored; unknown
        reserved keys, conflicting spellings of one option and invalid values raise
        :class:`ConfigError` naming the key as the user spelled it.
        """
        given: dict[str, tuple[str, str, object]] = {}  # target -> (user key, raw, parsed)
        for raw_key, raw_value in options.items():
            key = raw_key.strip().lower()
            option = BY_KEY.get(key)
            if option is None:
                if key.startswith(RESERVED_PREFIXES):
                    raise unknown_key(raw_key, raw_value)
                continue
            if not isinstance(raw_value, str):
                raise ConfigError(raw_key, raw_value, "a string")
            parsed = option.parse(raw_key, raw_value)
            previous = given.get(option.target)
            if previous is not None and previous[2] != parsed:
                raise ConfigError(
                    raw_key,
                    raw_value,
                    f"the same value as {previous[0]!r}={previous[1]!r} (both set {option.key!r})",
                )
            given[option.target] = (raw_key, raw_value, parsed)

        kwargs = {
            target: parsed
            for target, (_, _, parsed) in given.items()
            if target in CONFIG_FIELDS and target != "restart_strategy"
        }
        user_keys = {target: (key, raw) for target, (key, raw, _) in given.items()}
        kind = given["restart_strategy"][2] if "restart_strategy" in given else "none"
        for target, (key, raw, _) in given.items():
            prefix = target.split(".", 1)[0]
            if "." in target and prefix != kind:
                raise ConfigError(key, raw, f"only together with restart-strategy={prefix}")
        try:
            kwargs["restart_strategy"] = restart_from_given(str(kind), given)
            return CheckpointConfig(**kwargs)  # type: ignore[arg-type]  # validated
        except ConfigError as e:
            scoped = f"{kind}.{e.option}"
            for target in (e.option, scoped):
                if target in user_keys:
                    key, raw = user_keys[target]
                    raise ConfigError(key, raw, e.accepted) from e
            raise

    def to_options(self) -> dict[str, str]:
        """The canonical string options describing this config (every option, also those at
        their default), such that ``from_options(c.to_options()) == c``."""
        out: dict[str, str] = {}
        for name in CONFIG_FIELDS:
            value = getattr(self, name)
            if name == "restart_strategy" or (value is None and name != "interval_ms"):
                continue
            option = BY_TARGET[name]
            out[option.key] = option.render(value)
        strategy = self.restart_strategy
        out["restart-strategy"] = strategy.TYPE
        for param, value in strategy.to_dict().items():
            if param != "type":
                option = BY_TARGET[f"{strategy.TYPE}.{param}"]
                out[option.key] = option.render(value)
        return out

    # ------------------------------------------------------------------ JSON

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: field names as keys, enums by name, durations in ms, the restart
        strategy as a nested object."""
        d = asdict(self)
        d["mode"] = self.mode.value
        d["externalized_retention"] = self.externalized_retention.value
        d["restart_strategy"] = self.restart_strategy.to_dict()
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> CheckpointConfig:
        """Decode :meth:`to_dict`. Missing keys take their defaults; an unknown key or a value
        of the wrong type raises :class:`ConfigError`."""
        unknown = sorted(set(d) - set(CONFIG_FIELDS))
        if unknown:
            raise ConfigError(
                unknown[0], d[unknown[0]], f"one of the keys {', '.join(CONFIG_FIELDS)}"
            )
        kwargs: dict[str, Any] = dict(d)
        for name, enum in (
            ("mode", CheckpointingMode),
            ("externalized_retention", ExternalizedCheckpointRetention),
        ):
            if name in kwargs:
                try:
                    kwargs[name] = enum(kwargs[name])
                except ValueError:
                    names = " | ".join(m.value for m in enum)
                    raise ConfigError(name, kwargs[name], names) from None
        if "restart_strategy" in kwargs:
            kwargs["restart_strategy"] = restart_strategy_from_dict(kwargs["restart_strategy"])
        return CheckpointConfig(**kwargs)

    # ------------------------------------------------------------------ builder

    @staticmethod
    def builder() -> CheckpointConfigBuilder:

        return CheckpointConfigBuilder()

    def to_builder(self) -> CheckpointConfigBuilder:
        """A builder starting from this config."""

        return CheckpointConfigBuilder(self)


CONFIG_FIELDS: Final = tuple(f.name for f in fields(CheckpointConfig))


def restart_from_given(kind: str, given: Mapping[str, tuple[str, str, object]]) -> RestartStrategy:
    if kind == "none":
        return NoRestart()
    params: dict[str, Any] = dict(RESTART_DEFAULTS[kind])
    for param in params:
        entry = given.get(f"{kind}.{param}")
        if entry is not None:
            params[param] = entry[2]
    if kind == "fixed-delay":
        return FixedDelayRestart(**params)
    return FailureRateRestart(**params)


class CheckpointConfigBuilder:
    """Fluent builder mirroring Flink's Java ``CheckpointConfig`` setters. Setters return the
    builder; nothing is validated until :meth:`build`, which raises :class:`ConfigError`."""

    def __init__(self, base: CheckpointConfig | None = None) -> None:
        self._config = base if base is not None else CheckpointConfig()
        self._changes: dict[str, Any] = {}

    def _set(self, **changes: Any) -> CheckpointConfigBuilder:
        self._changes.update(changes)
        return self

    def enable_checkpointing(
        self, interval_ms: int, mode: CheckpointingMode = CheckpointingMode.EXACTLY_ONCE
    ) -> CheckpointConfigBuilder:
        return self._set(interval_ms=interval_ms, mode=mode)

    def disable_checkpointing(self) -> CheckpointConfigBuilder:
        return self._set(interval_ms=None)

    def set_checkpointing_mode(self, mode: CheckpointingMode) -> CheckpointConfigBuilder:
        return self._set(mode=mode)

    def set_checkpoint_timeout(self, timeout_ms: int) -> CheckpointConfigBuilder:
        return self._set(timeout_ms=timeout_ms)

    def set_min_pause_between_checkpoints(self, min_pause_ms: int) -> CheckpointConfigBuilder:
        return self._set(min_pause_ms=min_pause_ms)

    def set_max_concurrent_checkpoints(self, max_concurrent: int) -> CheckpointConfigBuilder:
        return self._set(max_concurrent=max_concurrent)

    def set_tolerable_checkpoint_failure_number(self, number: int) -> CheckpointConfigBuilder:
        return self._set(tolerable_failed_checkpoints=number)

    def enable_unaligned_checkpoints(self, enabled: bool = True) -> CheckpointConfigBuilder:
        return self._set(unaligned=enabled)

    def set_aligned_checkpoint_timeout(self, timeout_ms: int) -> CheckpointConfigBuilder:
        return self._set(aligned_checkpoint_timeout_ms=timeout_ms)

    def set_num_retained_checkpoints(self, retained: int) -> CheckpointConfigBuilder:
        return self._set(retained_checkpoints=retained)

    def set_checkpoint_history_size(self, size: int) -> CheckpointConfigBuilder:
        return self._set(history_size=size)

    def enable_externalized_checkpoints(
        self, retention: ExternalizedCheckpointRetention
    ) -> CheckpointConfigBuilder:
        return self._set(externalized_retention=retention)

    def set_checkpoint_storage(self, path: str) -> CheckpointConfigBuilder:
        return self._set(checkpoint_storage=path)

    def set_savepoint_dir(self, path: str) -> CheckpointConfigBuilder:
        return self._set(savepoint_dir=path)

    def set_restart_strategy(self, strategy: RestartStrategy) -> CheckpointConfigBuilder:
        return self._set(restart_strategy=strategy)

    def set_max_parallelism(self, max_parallelism: int) -> CheckpointConfigBuilder:
        return self._set(max_parallelism=max_parallelism)

    def build(self) -> CheckpointConfig:
        """The validated config. The builder stays usable (later setters do not affect
        configs already built)."""
        return replace(self._config, **self._changes)
