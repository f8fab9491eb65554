"""Checkpoint configuration: Flink's checkpoint options as one frozen, validated value.

A :class:`CheckpointConfig` is built from Spark-style string options
(:meth:`CheckpointConfig.from_options`: what a user passes with
``.option("checkpoint.interval", "10s")``), with the builder, which reads like Flink's Java
``CheckpointConfig``::

      config = (
          CheckpointConfig.builder()
          .enable_checkpointing(3000, CheckpointingMode.EXACTLY_ONCE)
          .set_restart_strategy(RestartStrategies.failure_rate_restart(3, days(1), minutes(1)))
          .build()
      )

or from its JSON form (:meth:`CheckpointConfig.from_dict`, the output of ``to_dict``). All
three validate alike: an invalid value raises :class:`~spark_ckpt.errors.ConfigError` naming
the option, the value and the accepted forms. All durations are integer milliseconds.

String options: keys are case-insensitive (Spark lower-cases data source option keys), and
Flink's spellings are aliases (the option table, :mod:`spark_ckpt.runtime.config.options`).
Durations are ``<digits>[ ]<unit>`` (:func:`parse_duration`; plain digits are milliseconds),
booleans ``true``/``false``/``yes``/``no``/``1``/``0``. Keys outside the reserved namespaces
``checkpoint.``, ``savepoint.``, ``restart-strategy``, ``state.`` and
``execution.checkpointing.`` are ignored. An unknown key inside them is a
:class:`ConfigError` (typo protection), and so is any of Flink's ``state.backend…`` keys (one
state backend, nothing to choose). Two spellings of one option must agree, and the
``restart-strategy.<type>.*`` keys need ``restart-strategy=<type>``.
:meth:`CheckpointConfig.to_options` returns the canonical keys:
``CheckpointConfig.from_options(c.to_options()) == c``.

Defaults are Flink's, except ``checkpoint.externalized-retention``
(``retain_on_cancellation``), ``checkpoint.history`` (100; Flink: 10) and
``checkpoint.interval``: spark-ckpt checkpoints every second unless told otherwise (Flink:
off), in every entry point alike, because a ``ckpt-sink`` query commits its output only at
completed checkpoints (``off`` disables them; savepoints and requested checkpoints still
work). Every key, alias, accepted value and default: ``docs/architecture.md``, *Checkpoint
options*.
"""

from spark_ckpt.runtime.config.checkpoint_config import CheckpointConfig, CheckpointConfigBuilder
from spark_ckpt.runtime.config.durations import (
    days,
    format_duration,
    hours,
    milliseconds,
    minutes,
    parse_duration,
    seconds,
)
from spark_ckpt.runtime.config.modes import (
    DEFAULT_INTERVAL_MS,
    MAX_MAX_PARALLELISM,
    MIN_INTERVAL_MS,
    CheckpointingMode,
    ExternalizedCheckpointRetention,
)
from spark_ckpt.runtime.config.options import RESERVED_PREFIXES, STATE_BACKEND_PREFIX, parse_option
from spark_ckpt.runtime.restart import (
    FailureRateRestart,
    FixedDelayRestart,
    NoRestart,
    RestartStrategies,
    RestartStrategy,
)

__all__ = [
    "DEFAULT_INTERVAL_MS",
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
