"""Checkpoint configuration: Flink's checkpoint options as one frozen, validated value.

A :class:`CheckpointConfig` is built in one of three ways, all validated the same way (every
invalid value raises :class:`~spark_ckpt.errors.ConfigError` naming the option, the value and
the accepted forms):

* from Spark-style string options, :meth:`CheckpointConfig.from_options` (what a user passes
  with ``.option("checkpoint.interval", "10s")``);
* with the builder, which reads like Flink's Java ``CheckpointConfig``::

      config = (
          CheckpointConfig.builder()
          .enable_checkpointing(3000, CheckpointingMode.EXACTLY_ONCE)
          .set_checkpoint_timeout(30_000)
          .set_restart_strategy(RestartStrategies.failure_rate_restart(3, days(1), minutes(1)))
          .set_checkpoint_storage("/lake/ck")
          .build()
      )

* from its JSON form, :meth:`CheckpointConfig.from_dict` (output of ``to_dict``).

All durations are integer milliseconds.

String options
--------------
Keys are matched case-insensitively (Spark lower-cases data source option keys). Durations
are ``<digits>[ ]<unit>`` with unit ``ms``/``milli(s)``/``millisecond(s)``, ``s``/``sec(s)``/
``second(s)``, ``m``/``min``/``minute(s)``, ``h``/``hour(s)``, ``d``/``day(s)`` (any case);
plain digits are milliseconds. Booleans are ``true``/``false``/``yes``/``no``/``1``/``0``.

====================================  ==========================================  ==========
Key (Flink aliases)                   Value                                       Default
====================================  ==========================================  ==========
``checkpoint.interval``               duration >= 10 ms, or ``off``/``none``      ``1s`` (*)
(``execution.checkpointing.interval``)
``checkpoint.mode``                   ``exactly_once`` | ``at_least_once``        exactly once
(``execution.checkpointing.mode``)    (any case, ``-`` or ``_``)
``checkpoint.timeout``                duration >= 1 ms                            ``10min``
(``execution.checkpointing.timeout``)
``checkpoint.min-pause``              duration >= 0                               ``0``
(``execution.checkpointing.min-pause``)
``checkpoint.max-concurrent``         integer >= 1                                ``1``
(``execution.checkpointing.max-concurrent-checkpoints``)
``checkpoint.tolerable-failures``     integer >= 0                                ``0``
(``execution.checkpointing.tolerable-failed-checkpoints``)
``checkpoint.unaligned``              boolean                                     ``false``
(``execution.checkpointing.unaligned``, ``execution.checkpointing.unaligned.enabled``)
``checkpoint.aligned-timeout``        duration >= 0 (0 = never switch)            ``0``
(``execution.checkpointing.aligned-checkpoint-timeout``)
``checkpoint.retained``               integer >= 1                                ``1``
(``execution.checkpointing.num-retained``, ``state.checkpoints.num-retained``)
``checkpoint.history``                integer >= 1: finished checkpoints the      ``100``
(``web.checkpoints.history``)         statistics history keeps
``checkpoint.externalized-retention`` ``no_externalized_checkpoints`` |           ``retain_o…``
(``execution.checkpointing.           ``delete_on_cancellation`` |                (see below)
externalized-checkpoint-retention``)  ``retain_on_cancellation``
``checkpoint.storage``                path or URI of the checkpoint store root    unset
(``execution.checkpointing.dir``, ``state.checkpoints.dir``)
``savepoint.dir``                     path or URI of the default savepoint dir    unset
(``execution.checkpointing.savepoint-dir``, ``state.savepoints.dir``)
``restart-strategy``                  ``none`` | ``fixed-delay`` | ``failure-rate``  ``none``
(``restart-strategy.type``)
``restart-strategy.fixed-delay.       integer >= 0                                ``1``
attempts``
``restart-strategy.fixed-delay.delay``  duration >= 0                             ``1s``
``restart-strategy.failure-rate.      integer >= 1                                ``1``
max-failures`` (``…max-failures-per-interval``)
``restart-strategy.failure-rate.      duration >= 1 ms                            ``1min``
interval`` (``…failure-rate-interval``)
``restart-strategy.failure-rate.delay``  duration >= 0                            ``1s``
``state.max-parallelism``             integer in 1..32768 (number of key groups)  ``128``
(``pipeline.max-parallelism``)
====================================  ==========================================  ==========

(*) Flink's default is ``off``. spark-ckpt checkpoints every second unless told otherwise, in
every entry point alike (:class:`~spark_ckpt.spark.pipeline.Pipeline`, a raw ``ckpt-source``,
the builder): a ``ckpt-sink`` query commits its output only at completed checkpoints, so
without periodic checkpoints it would never commit. ``off`` disables them (savepoints and
requested checkpoints still work).

Keys outside the reserved namespaces ``checkpoint.``, ``savepoint.``, ``restart-strategy``,
``state.`` and ``execution.checkpointing.`` belong to other subsystems and are ignored. An
unknown key inside a reserved namespace is a :class:`ConfigError` (typo protection), and so
is any of Flink's ``state.backend…`` keys: there is one state backend, nothing to choose. Two
spellings of one option must agree. The ``restart-strategy.<type>.*`` keys are accepted only
together with ``restart-strategy=<type>``.

:meth:`CheckpointConfig.to_options` returns the canonical keys, so
``CheckpointConfig.from_options(c.to_options()) == c``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from typing import Any, Final

from spark_ckpt.errors import ConfigError
from spark_ckpt.protocol.option import MAX_LONG, check_int
from spark_ckpt.runtime.restart import (
    FailureRateRestart,
    FixedDelayRestart,
    NoRestart,
    RestartStrategies,
    RestartStrategy,
    restart_strategy_from_dict,
)
from spark_ckpt.storage.history import DEFAULT_HISTORY_SIZE

#: The default checkpoint interval (Flink's default is off; see the module docstring).
DEFAULT_INTERVAL_MS: Final = 1000
#: Smallest checkpoint interval (Flink's ``MINIMAL_CHECKPOINT_TIME``).
MIN_INTERVAL_MS: Final = 10
#: Largest max parallelism (number of key groups), Flink's ``UPPER_BOUND_MAX_PARALLELISM``.
MAX_MAX_PARALLELISM: Final = 32768


class CheckpointingMode(StrEnum):
    """Consistency guarantee of checkpoints. ``AT_LEAST_ONCE`` does not block channels during
    alignment (records after a barrier may be processed before the snapshot)."""

    EXACTLY_ONCE = "EXACTLY_ONCE"
    AT_LEAST_ONCE = "AT_LEAST_ONCE"


class ExternalizedCheckpointRetention(StrEnum):
    """What happens to retained checkpoints when the job is cancelled."""

    NO_EXTERNALIZED_CHECKPOINTS = "NO_EXTERNALIZED_CHECKPOINTS"
    DELETE_ON_CANCELLATION = "DELETE_ON_CANCELLATION"
    RETAIN_ON_CANCELLATION = "RETAIN_ON_CANCELLATION"


# --------------------------------------------------------------------------- durations


def milliseconds(n: int) -> int:
    return n


def seconds(n: int) -> int:
    return n * 1000


def minutes(n: int) -> int:
    return n * 60_000


def hours(n: int) -> int:
    return n * 3_600_000


def days(n: int) -> int:
    return n * 86_400_000


#: Unit label (lower case) -> milliseconds, Flink's ``TimeUtils`` labels without sub-ms units.
_UNITS: Final[dict[str, int]] = {
    **dict.fromkeys(("ms", "milli", "millis", "millisecond", "milliseconds"), 1),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1000),
    **dict.fromkeys(("m", "min", "minute", "minutes"), 60_000),
    **dict.fromkeys(("h", "hour", "hours"), 3_600_000),
    **dict.fromkeys(("d", "day", "days"), 86_400_000),
}
_DURATION_RE: Final = re.compile(r"([0-9]+)\s*([a-z]*)")
_DURATION_FORMS: Final = (
    "a non-negative whole duration such as '500ms', '10s', '1min', '2 h', '1d' "
    "(plain digits are milliseconds)"
)


def parse_duration(option: str, text: str) -> int:
    """Parse a duration such as ``"10s"``, ``"500ms"``, ``"1min"``, ``"2 h"``, ``"1d"`` or
    ``"250"`` (plain digits are milliseconds) into integer milliseconds.

    Units (case-insensitive, optional whitespace before the unit): ``ms``, ``milli(s)``,
    ``millisecond(s)``, ``s``, ``sec(s)``, ``second(s)``, ``m``, ``min``, ``minute(s)``,
    ``h``, ``hour(s)``, ``d``, ``day(s)``. Negative, fractional, empty or unparsable text,
    and values above 2^63-1 ms, raise :class:`ConfigError` naming *option*.
    """
    match = _DURATION_RE.fullmatch(text.strip().lower()) if isinstance(text, str) else None
    if match is None:
        raise ConfigError(option, text, _DURATION_FORMS)
    digits, unit = match.groups()
    factor = _UNITS.get(unit or "ms")
    if factor is None:
        raise ConfigError(option, text, _DURATION_FORMS)
    ms = int(digits) * factor
    if ms > MAX_LONG:
        raise ConfigError(option, text, f"a duration of at most {MAX_LONG} ms")
    return ms


def format_duration(ms: int) -> str:
    """Render *ms* in the largest unit that represents it exactly (``90000`` -> ``"90s"``,
    ``0`` -> ``"0ms"``); :func:`parse_duration` reads it back to the same value."""
    for unit, factor in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms and ms % factor == 0:
            return f"{ms // factor}{unit}"
    return f"{ms}ms"


# --------------------------------------------------------------------------- value parsers

_TRUE: Final = frozenset({"true", "yes", "1"})
_FALSE: Final = frozenset({"false", "no", "0"})
_INT_RE: Final = re.compile(r"[+-]?[0-9]+")


def _parse_bool(option: str, text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ConfigError(option, text, "true/false, yes/no or 1/0 (any case)")


def _parse_int(option: str, text: str) -> int:
    stripped = text.strip()
    if _INT_RE.fullmatch(stripped) is None:
        raise ConfigError(option, text, "an integer")
    return int(stripped)


def _parse_interval(option: str, text: str) -> int | None:
    if text.strip().lower() in ("off", "none"):
        return None
    try:
        return parse_duration(option, text)
    except ConfigError:
        raise ConfigError(option, text, f"'off', 'none' or {_DURATION_FORMS}") from None


def _enum_parser(enum: type[StrEnum]) -> Callable[[str, str], StrEnum]:
    def parse(option: str, text: str) -> StrEnum:
        name = re.sub(r"[-\s]", "_", text.strip()).upper()
        try:
            return enum[name]
        except KeyError:
            names = " | ".join(m.name.lower() for m in enum)
            raise ConfigError(option, text, f"{names} (any case, '-' or '_')") from None

    return parse


def _parse_path(option: str, text: str) -> str:
    if not text.strip():
        raise ConfigError(option, text, "a non-empty path or URI")
    return text


_RESTART_TYPES: Final[dict[str, str]] = {
    "none": "none",
    "off": "none",
    "disable": "none",
    "fixed-delay": "fixed-delay",
    "fixeddelay": "fixed-delay",
    "failure-rate": "failure-rate",
    "failurerate": "failure-rate",
}


def _parse_restart_type(option: str, text: str) -> str:
    kind = _RESTART_TYPES.get(text.strip().lower().replace("_", "-"))
    if kind is None:
        raise ConfigError(option, text, "none | fixed-delay | failure-rate")
    return kind


# --------------------------------------------------------------------------- option table


@dataclass(frozen=True)
class _Option:
    key: str  # canonical key
    aliases: tuple[str, ...]
    parse: Callable[[str, str], object]
    render: Callable[[Any], str]
    target: str  # CheckpointConfig field, or the restart strategy's field


def _render_str(value: Any) -> str:
    return str(value)


def _render_enum(value: Any) -> str:
    return str(value.name.lower())


def _render_bool(value: Any) -> str:
    return "true" if value else "false"


def _render_interval(value: Any) -> str:
    return "off" if value is None else format_duration(value)


_OPTIONS: Final[tuple[_Option, ...]] = (
    _Option(
        "checkpoint.interval",
        ("execution.checkpointing.interval",),
        _parse_interval,
        _render_interval,
        "interval_ms",
    ),
    _Option(
        "checkpoint.mode",
        ("execution.checkpointing.mode",),
        _enum_parser(CheckpointingMode),
        _render_enum,
        "mode",
    ),
    _Option(
        "checkpoint.timeout",
        ("execution.checkpointing.timeout",),
        parse_duration,
        format_duration,
        "timeout_ms",
    ),
    _Option(
        "checkpoint.min-pause",
        ("execution.checkpointing.min-pause",),
        parse_duration,
        format_duration,
        "min_pause_ms",
    ),
    _Option(
        "checkpoint.max-concurrent",
        ("execution.checkpointing.max-concurrent-checkpoints",),
        _parse_int,
        _render_str,
        "max_concurrent",
    ),
    _Option(
        "checkpoint.tolerable-failures",
        ("execution.checkpointing.tolerable-failed-checkpoints",),
        _parse_int,
        _render_str,
        "tolerable_failed_checkpoints",
    ),
    _Option(
        "checkpoint.unaligned",
        ("execution.checkpointing.unaligned", "execution.checkpointing.unaligned.enabled"),
        _parse_bool,
        _render_bool,
        "unaligned",
    ),
    _Option(
        "checkpoint.aligned-timeout",
        ("execution.checkpointing.aligned-checkpoint-timeout",),
        parse_duration,
        format_duration,
        "aligned_checkpoint_timeout_ms",
    ),
    _Option(
        "checkpoint.retained",
        ("execution.checkpointing.num-retained", "state.checkpoints.num-retained"),
        _parse_int,
        _render_str,
        "retained_checkpoints",
    ),
    _Option(
        "checkpoint.history",
        ("web.checkpoints.history",),
        _parse_int,
        _render_str,
        "history_size",
    ),
    _Option(
        "checkpoint.externalized-retention",
        ("execution.checkpointing.externalized-checkpoint-retention",),
        _enum_parser(ExternalizedCheckpointRetention),
        _render_enum,
        "externalized_retention",
    ),
    _Option(
        "checkpoint.storage",
        ("execution.checkpointing.dir", "state.checkpoints.dir"),
        _parse_path,
        _render_str,
        "checkpoint_storage",
    ),
    _Option(
        "savepoint.dir",
        ("execution.checkpointing.savepoint-dir", "state.savepoints.dir"),
        _parse_path,
        _render_str,
        "savepoint_dir",
    ),
    _Option(
        "state.max-parallelism",
        ("pipeline.max-parallelism",),
        _parse_int,
        _render_str,
        "max_parallelism",
    ),
    _Option(
        "restart-strategy",
        ("restart-strategy.type",),
        _parse_restart_type,
        _render_str,
        "restart_strategy",
    ),
    _Option(
        "restart-strategy.fixed-delay.attempts",
        (),
        _parse_int,
        _render_str,
        "fixed-delay.attempts",
    ),
    _Option(
        "restart-strategy.fixed-delay.delay",
        (),
        parse_duration,
        format_duration,
        "fixed-delay.delay_ms",
    ),
    _Option(
        "restart-strategy.failure-rate.max-failures",
        ("restart-strategy.failure-rate.max-failures-per-interval",),
        _parse_int,
        _render_str,
        "failure-rate.max_failures_per_interval",
    ),
    _Option(
        "restart-strategy.failure-rate.interval",
        ("restart-strategy.failure-rate.failure-rate-interval",),
        parse_duration,
        format_duration,
        "failure-rate.failure_interval_ms",
    ),
    _Option(
        "restart-strategy.failure-rate.delay",
        (),
        parse_duration,
        format_duration,
        "failure-rate.delay_ms",
    ),
)

#: Every accepted spelling (lower case) -> its option.
_BY_KEY: Final[dict[str, _Option]] = {k: o for o in _OPTIONS for k in (o.key, *o.aliases)}
_BY_TARGET: Final[dict[str, _Option]] = {o.target: o for o in _OPTIONS}

#: Namespaces this module owns: an unknown key starting with one of these is an error.
RESERVED_PREFIXES: Final = (
    "checkpoint.",
    "savepoint.",
    "restart-strategy",
    "state.",
    "execution.checkpointing.",
)
#: Flink's state backend options (``state.backend.type``, ``state.backend.incremental``, …):
#: refused, there is one state backend (see :func:`_unknown_key`).
STATE_BACKEND_PREFIX: Final = "state.backend"

#: Flink's defaults for the parameters of a restart strategy chosen by type only.
_RESTART_DEFAULTS: Final[dict[str, dict[str, int]]] = {
    "fixed-delay": {"attempts": 1, "delay_ms": 1000},
    "failure-rate": {
        "max_failures_per_interval": 1,
        "failure_interval_ms": 60_000,
        "delay_ms": 1000,
    },
}


def _known_keys() -> str:
    return ", ".join(sorted(o.key for o in _OPTIONS)) + " (or their Flink spellings)"


def _unknown_key(key: str, value: object) -> ConfigError:
    """The error for *key*, inside the reserved namespaces but no option."""
    if key.strip().lower().startswith(STATE_BACKEND_PREFIX):
        return ConfigError(
            key,
            value,
            "no state.backend option: spark-ckpt has one state backend (keyed state as Arrow "
            "tables in each subtask, checkpoints always incremental), nothing to choose",
        )
    return ConfigError(key, value, f"a known option key: {_known_keys()}")


def parse_option(key: str, value: str) -> tuple[str, object] | None:
    """The canonical key of the option spelled *key* (any case, Flink aliases) and *value*
    parsed as :meth:`CheckpointConfig.from_options` parses it; ``None`` when *key* is outside
    the reserved namespaces. An unknown key inside them (``state.backend…`` too) or an invalid
    value raises the :class:`ConfigError` ``from_options`` would."""
    lowered = key.strip().lower()
    option = _BY_KEY.get(lowered)
    if option is None:
        if lowered.startswith(RESERVED_PREFIXES):
            raise _unknown_key(key, value)
        return None
    return option.key, option.parse(key, value)


# --------------------------------------------------------------------------- the config


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
        """Build a config from string options (see the module docstring for the keys).

        Keys are case-insensitive; keys outside the reserved namespaces are ignored; unknown
        reserved keys, conflicting spellings of one option and invalid values raise
        :class:`ConfigError` naming the key as the user spelled it.
        """
        given: dict[str, tuple[str, str, object]] = {}  # target -> (user key, raw, parsed)
        for raw_key, raw_value in options.items():
            key = raw_key.strip().lower()
            option = _BY_KEY.get(key)
            if option is None:
                if key.startswith(RESERVED_PREFIXES):
                    raise _unknown_key(raw_key, raw_value)
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
            if target in _CONFIG_FIELDS and target != "restart_strategy"
        }
        user_keys = {target: (key, raw) for target, (key, raw, _) in given.items()}
        kind = given["restart_strategy"][2] if "restart_strategy" in given else "none"
        for target, (key, raw, _) in given.items():
            prefix = target.split(".", 1)[0]
            if "." in target and prefix != kind:
                raise ConfigError(key, raw, f"only together with restart-strategy={prefix}")
        try:
            kwargs["restart_strategy"] = _restart_from_given(str(kind), given)
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
        for name in _CONFIG_FIELDS:
            value = getattr(self, name)
            if name == "restart_strategy" or (value is None and name != "interval_ms"):
                continue
            option = _BY_TARGET[name]
            out[option.key] = option.render(value)
        strategy = self.restart_strategy
        out["restart-strategy"] = strategy.TYPE
        for param, value in strategy.to_dict().items():
            if param != "type":
                option = _BY_TARGET[f"{strategy.TYPE}.{param}"]
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
        unknown = sorted(set(d) - set(_CONFIG_FIELDS))
        if unknown:
            raise ConfigError(
                unknown[0], d[unknown[0]], f"one of the keys {', '.join(_CONFIG_FIELDS)}"
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


_CONFIG_FIELDS: Final = tuple(f.name for f in fields(CheckpointConfig))


def _restart_from_given(kind: str, given: Mapping[str, tuple[str, str, object]]) -> RestartStrategy:
    if kind == "none":
        return NoRestart()
    params: dict[str, Any] = dict(_RESTART_DEFAULTS[kind])
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


__all__ = [
    "MAX_MAX_PARALLELISM",
    "MIN_INTERVAL_MS",
    "RESERVED_PREFIXES",
    "STATE_BACKEND_PREFIX",
    "CheckpointConfig",
    "CheckpointConfigBuilder",
    "CheckpointingMode",
    "ExternalizedCheckpointRetention",
    "FailureRateRestart",
    "FixedDelayRestart",
    "NoRestart",
    "RestartStrategies",
    "RestartStrategy",
    "days",
    "format_duration",
    "hours",
    "milliseconds",
    "minutes",
    "parse_duration",
    "parse_option",
    "seconds",
]
