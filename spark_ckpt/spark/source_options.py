"""Options of ``spark.readStream.format("ckpt-source")``, parsed and validated in one place.

Parsed where they are given — the user's process (the pipeline API validates before
``load()``, so errors are :class:`~spark_ckpt.errors.ConfigError` naming the option) and again
inside Spark's source runner. Keys are case-insensitive (Spark lower-cases them).

==========================  =========================================================
option                      meaning
==========================  =========================================================
``pipeline`` (required)     name of the pipeline: one checkpoint store, one coordinator
``store``                   pipeline root (checkpoint store, mailbox); default
                            ``./spark-ckpt-data/<pipeline>`` made absolute
``source``                  ``generator`` (default) or ``delta``
``maxRowsPerTrigger``       read limit per micro-batch, shared equally by the channels
``barrierPlacement``        ``read`` (default: at the end of the micro-batch that takes the
                            trigger) or ``head`` (at each channel's produced head, so a
                            channel with a deeper backlog reaches it later); see
                            :class:`~spark_ckpt.sources.stream_offset.BarrierPlacement`
generator: ``seed``, ``channels``, ``rate``, ``backlog``, ``keys``, ``skew``
delta: ``path``, ``channels``, ``startingVersion``
``run``                     set by :meth:`Pipeline.run <spark_ckpt.spark.pipeline.Pipeline.run>`
                            for each attempt (see :mod:`spark_ckpt.spark.run`); not for users
``checkpoint.*``, ``execution.checkpointing.*``, ``restart-strategy*``, ``state.*``,
``savepoint.*``             checkpoint configuration
(:class:`~spark_ckpt.runtime.config.CheckpointConfig`)
==========================  =========================================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from spark_ckpt.errors import ConfigError
from spark_ckpt.runtime.config import RESERVED_PREFIXES, CheckpointConfig
from spark_ckpt.sources.generator import GeneratorSpec
from spark_ckpt.sources.stream_offset import BarrierPlacement

SOURCE_KINDS: Final = ("generator", "delta")
_OWN_KEYS: Final = frozenset(
    {"pipeline", "store", "source", "maxrowspertrigger", "barrierplacement", "run"}
)
_DELTA_KEYS: Final = frozenset({"path", "channels", "startingversion"})
_GENERATOR_KEYS: Final = frozenset(k.lower() for k in GeneratorSpec.OPTION_KEYS)
DEFAULT_STORE_DIR: Final = "spark-ckpt-data"


def default_root(pipeline: str) -> str:
    return os.path.abspath(os.path.join(DEFAULT_STORE_DIR, pipeline))


@dataclass(frozen=True)
class SourceOptions:
    pipeline: str
    root: str
    source: str
    max_rows_per_trigger: int | None
    config: CheckpointConfig
    barrier_placement: BarrierPlacement = BarrierPlacement.READ
    generator: GeneratorSpec | None = None
    delta: dict[str, str] = field(default_factory=dict)
    raw: dict[str, str] = field(default_factory=dict)
    run_id: str | None = None

    @staticmethod
    def parse(options: Mapping[str, str]) -> SourceOptions:
        opts = {str(k).strip().lower(): str(v) for k, v in options.items()}
        pipeline = opts.get("pipeline", "").strip()
        if not pipeline or "/" in pipeline or pipeline.startswith("."):
            raise ConfigError("pipeline", opts.get("pipeline"), "a non-empty name without '/'")
        source = opts.get("source", "generator").strip().lower()
        if source not in SOURCE_KINDS:
            raise ConfigError("source", opts.get("source"), " or ".join(SOURCE_KINDS))
        allowed = _OWN_KEYS | (_GENERATOR_KEYS if source == "generator" else _DELTA_KEYS)
        for key in opts:
            if key not in allowed and not key.startswith(RESERVED_PREFIXES):
                raise ConfigError(
                    key, opts[key], f"a ckpt-source option for source={source}: {sorted(allowed)}"
                )
        limit_text = opts.get("maxrowspertrigger")
        limit: int | None = None
        if limit_text is not None:
            try:
                limit = int(limit_text)
            except ValueError:
                limit = 0
            if limit < 1:
                raise ConfigError("maxRowsPerTrigger", limit_text, "a positive integer")
        placement_text = opts.get("barrierplacement", BarrierPlacement.READ.value)
        try:
            placement = BarrierPlacement(placement_text.strip().lower())
        except ValueError:
            raise ConfigError(
                "barrierPlacement", placement_text, " or ".join(p.value for p in BarrierPlacement)
            ) from None
        config = CheckpointConfig.from_options(opts)
        root = opts.get("store") or config.checkpoint_storage or default_root(pipeline)
        generator = GeneratorSpec.from_options(opts) if source == "generator" else None
        delta = {k: v for k, v in opts.items() if k in _DELTA_KEYS} if source == "delta" else {}
        if source == "delta" and "path" not in delta:
            raise ConfigError("path", None, "the path of the Delta table to tail (source=delta)")
        return SourceOptions(
            pipeline=pipeline,
            root=root if "://" in root else os.path.abspath(root),
            source=source,
            max_rows_per_trigger=limit,
            config=config,
            barrier_placement=placement,
            generator=generator,
            delta=delta,
            raw=opts,
            run_id=opts.get("run") or None,
        )
