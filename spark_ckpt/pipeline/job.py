"""What a pipeline runs: the job's description, shared by every run (attempt) of it.

A :class:`JobSpec` holds the source's ``ckpt-source`` options, the operators (with their
stable uids), the output Delta table and the task layout. It is a value: each run builds its
own foreachBatch function, coordinator and sink recovery from it, so nothing stateful
survives from one attempt into the next.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypedDict, Unpack

from spark_ckpt.errors import ConfigError
from spark_ckpt.locations.uris import normalized
from spark_ckpt.protocol.trace import NOOP_TRACER, Tracer
from spark_ckpt.runtime.components import load_components
from spark_ckpt.runtime.event_time import WatermarkStrategy
from spark_ckpt.runtime.operator import KeyedOperator


class Placement(StrEnum):
    """Where the subtasks run: ``driver`` — in the process that calls ``foreachBatch`` (the
    user's driver, or the Spark Connect server), which collects every micro-batch;
    ``executors`` — inside Spark tasks on the executors, next to their state
    (:mod:`spark_ckpt.spark.executors.subtask_function`)."""

    DRIVER = "driver"
    EXECUTORS = "executors"


Source = Mapping[str, object]
Operators = KeyedOperator | Sequence[KeyedOperator]


class JobOptions(TypedDict, total=False):
    """The job's optional settings, as every entry point takes them (keywords; defaults and
    meaning: :class:`JobSpec`)."""

    parallelism: int
    pipelined: bool
    tracer: Tracer
    placement: Placement | str
    transform: Callable[[Any], Any] | None
    components: str | None
    watermark: WatermarkStrategy | None
    late_output: str | None


@dataclass(frozen=True)
class JobSpec:
    """*source* (``ckpt-source`` options) through *operators* (keyed state, aligned as the
    pipeline's configuration says) into the Delta table *output*, exactly-once, on
    *parallelism* subtasks. The operators form a chain: each receives the previous one's
    output (the first receives the source's rows), and the last one's output goes to
    *output*. The chain is keyed by one column (rows are routed to subtasks by its key group
    before the first operator), and each operator's state is restored by its uid, wherever
    it stands in the chain, so uids must be distinct. *pipelined*: process a micro-batch
    while Spark reads the next (see :class:`~spark_ckpt.spark.driver.batch_aligner.BatchAligner`).
    *tracer*: receives the engine's spans where the subtasks run (picklable and cheap; see
    :mod:`spark_ckpt.protocol.trace`), injected like the clock. *placement*: where the
    subtasks run (:class:`Placement`). *components*: ``module:name`` of a
    :class:`~spark_ckpt.runtime.components.Components` object whose hooks hand the job's
    processes their store, sink committer, source and operators (default: the pipeline's
    own; :mod:`spark_ckpt.runtime.components`). *watermark*: event time, from a column of
    the rows the first operator receives
    (:class:`~spark_ckpt.runtime.event_time.WatermarkStrategy`; ``docs/time.md``).
    *late_output*: a Delta table that receives, exactly once, the rows dropped as late (those
    rows' own columns; Flink's side output of late data), another table than *output*."""

    source: Source
    operators: tuple[KeyedOperator, ...]
    output: str
    parallelism: int = 2
    pipelined: bool = True
    tracer: Tracer = NOOP_TRACER
    placement: Placement = Placement.EXECUTORS
    #: Spark SQL applied to the source DataFrame before the operators (the driver builds
    #: the query with it; see :mod:`spark_ckpt.pipeline.transform`)
    transform: Callable[[Any], Any] | None = None
    components: str | None = None
    watermark: WatermarkStrategy | None = None
    late_output: str | None = None

    @staticmethod
    def of(
        source: Source, operators: Operators, *, output: str, **options: Unpack[JobOptions]
    ) -> JobSpec:
        """A validated spec: at least one operator, distinct uids, a known placement; a
        local *output* made absolute."""
        unknown = sorted(set(options) - set(JobOptions.__annotations__))
        if unknown:  # **options are typed for mypy; at run time a misspelt keyword lands here
            raise TypeError(
                f"unexpected keyword argument {unknown[0]!r} "
                f"(the job's options: {', '.join(JobOptions.__annotations__)})"
            )
        placement = options.get("placement", JobSpec.placement)
        try:
            where = Placement(str(placement).strip().lower())
        except ValueError:
            raise ConfigError(
                "placement", placement, " or ".join(p.value for p in Placement)
            ) from None
        ops = (operators,) if isinstance(operators, KeyedOperator) else tuple(operators)
        if not ops:
            raise ConfigError("operators", (), "at least one KeyedOperator")
        for op in ops:
            if not isinstance(op, KeyedOperator):
                raise ConfigError("operators", type(op).__name__, "KeyedOperator instances")
        uids = [op.uid for op in ops]
        repeated = sorted({u for u in uids if uids.count(u) > 1})
        if repeated:
            raise ConfigError(
                "operators", uids, f"operators with distinct uids ({repeated[0]!r} is repeated)"
            )
        keys = sorted({op.key_column for op in ops})
        if len(keys) > 1:
            raise ConfigError(
                "operators",
                uids,
                "a chain keyed by one column (the rows are routed to subtasks by it before "
                f"the first operator; these are keyed by {', '.join(map(repr, keys))})",
            )
        out = normalized(output)
        components = options.get("components", JobSpec.components) or None
        load_components(components)  # a ConfigError names it before anything runs
        watermark = options.get("watermark", JobSpec.watermark)
        if watermark is not None and not isinstance(watermark, WatermarkStrategy):
            raise ConfigError(
                "watermark", watermark, "a WatermarkStrategy (e.g. forBoundedOutOfOrderness)"
            )
        if watermark is not None and any(k.lower().startswith("watermark.") for k in source):
            raise ConfigError(
                "watermark", watermark, "one strategy: the source options name one already"
            )
        late = options.get("late_output", JobSpec.late_output)
        if late is not None:
            if not isinstance(late, str) or not late:
                raise ConfigError("late_output", late, "the path of a Delta table")
            late = normalized(late)
            if late == out:
                raise ConfigError("late_output", late, "another table than the output")
        return JobSpec(
            dict(source),
            ops,
            out,
            options.get("parallelism", JobSpec.parallelism),  # the fields' defaults
            options.get("pipelined", JobSpec.pipelined),
            options.get("tracer", JobSpec.tracer),
            where,
            options.get("transform", JobSpec.transform),
            components,
            watermark,
            late,
        )
