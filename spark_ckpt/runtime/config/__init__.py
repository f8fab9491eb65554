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
every entry point alike (:class:`~spark_ckpt.pipeline.pipeline.Pipeline`, a raw ``ckpt-source``,
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
