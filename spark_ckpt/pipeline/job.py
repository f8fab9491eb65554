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
from itertools import pairwise
from typing import Any, TypedDict, Unpack

from spark_ckpt.errors import ConfigError
from spark_ckpt.locations.uris import normalized
from spark_ckpt.protocol.trace import NOOP_TRACER, Tracer
from spark_ckpt.runtime.co_operator import KeyedCoOperator
from spark_ckpt.runtime.components import load_components
from spark_ckpt.runtime.event_time import WatermarkStrategy
from spark_ckpt.runtime.operator import KeyedOperator
from spark_ckpt.runtime.stage import Stage


class Placement(StrEnum):
    """Where the subtasks run: ``driver`` — in the process that calls ``foreachBatch`` (the
    user's driver, or the Spark Connect server), which collects every micro-batch;
    ``executors`` — inside Spark tasks on the executors, next to their state
    (:mod:`spark_ckpt.spark.executors.subtask_function`)."""

    DRIVER = "driver"
    EXECUTORS = "executors"


Source = Mapping[str, object]
Operators = KeyedOperator | Sequence[KeyedOperator] | Sequence[Stage]


class JobOptions(TypedDict, total=False):
    """The job's optional settings, as every entry point takes them (keywords; defaults and
    meaning: :class:`JobSpec`)."""

    parallelism: int
    pipelined: bool
    tracer: Tracer
    placement: Placement | str
    transform: Callable[[Any], Any] | Mapping[str, Callable[[Any], Any]] | None
    components: str | None
    watermark: WatermarkStrategy | Mapping[str, WatermarkStrategy | None] | None
    late_output: str | None
    sources: Mapping[str, Source] | None
    outputs: Mapping[str, str] | None


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
    rows' own columns; Flink's side output of late data), another table than *output*.

    *inputs*: several named inputs instead of one *source* (``sources={"clicks": {...},
    "impressions": {...}}``, each a ``ckpt-source``'s options; :mod:`spark_ckpt.sources.inputs`),
    read by an operator over several inputs
    (:class:`~spark_ckpt.runtime.co_operator.KeyedCoOperator`) or, when they have one schema,
    by a one-input operator over their union; *input_watermarks*: each input's strategy (a
    single *watermark* applies to every input).

    *side_outputs*: the operators' named outputs (``outputs={name: path}``, Flink's side
    outputs: rows an operator gives ``StateContext.output(name, rows)``), each a Delta table of
    its own, committed exactly once with the same checkpoint as *output*, rolled back with it
    on a restore."""

    source: Source
    operators: tuple[KeyedOperator, ...]
    output: str
    parallelism: int = 2
    pipelined: bool = True
    tracer: Tracer = NOOP_TRACER
    placement: Placement = Placement.EXECUTORS
    #: Spark SQL applied to the source DataFrame before the operators (the driver builds
    #: the query with it; see :mod:`spark_ckpt.pipeline.transform`); several inputs: one per
    #: input name that has one (``transform={"clicks": f}``)
    transform: Callable[[Any], Any] | Mapping[str, Callable[[Any], Any]] | None = None
    components: str | None = None
    watermark: WatermarkStrategy | None = None
    late_output: str | None = None
    inputs: tuple[tuple[str, Source], ...] = ()
    input_watermarks: tuple[tuple[str, WatermarkStrategy | None], ...] = ()
    side_outputs: tuple[tuple[str, str], ...] = ()
    #: several keyed stages (``operators=[Stage(...), Stage(...)]``): every stage, named, the
    #: first one's operators and parallelism being *operators* and *parallelism*, each later
    #: one's output table (a Stage's ``output``) made absolute; empty: one stage
    stages: tuple[Stage, ...] = ()

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.inputs)

    @property
    def all_operators(self) -> tuple[KeyedOperator, ...]:
        """The operators of every stage, stage by stage."""
        if not self.stages:
            return self.operators
        return tuple(op for stage in self.stages for op in stage.operators)

    @staticmethod
    def of(
        source: Source | None, operators: Operators, *, output: str, **options: Unpack[JobOptions]
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
        stages = _stages(operators)
        if stages:
            ops = stages[0].operators
            if stages[0].parallelism is not None:
                options = {**options, "parallelism": stages[0].parallelism}
        else:
            ops = (operators,) if isinstance(operators, KeyedOperator) else tuple(operators)  # type: ignore[arg-type]
        if not ops:
            raise ConfigError("operators", (), "at least one KeyedOperator")
        for op in ops:
            if not isinstance(op, KeyedOperator):
                raise ConfigError("operators", type(op).__name__, "KeyedOperator instances")
        every = tuple(op for st in stages for op in st.operators) if stages else ops
        uids = [op.uid for op in every]
        repeated = sorted({u for u in uids if uids.count(u) > 1})
        if repeated:
            raise ConfigError(
                "operators", uids, f"operators with distinct uids ({repeated[0]!r} is repeated)"
            )
        named = options.get("sources")
        if (named is None) == (source is None):
            raise ConfigError(
                "sources",
                None if named is None else sorted(named),
                "either one source (its options) or named inputs (sources={name: options}), "
                "not both",
            )
        inputs, watermarks = _inputs(named, options.get("watermark"), ops)
        given_watermark = options.get("watermark", JobSpec.watermark)
        if len(inputs) == 1 and not isinstance(ops[0], KeyedCoOperator):
            # a graph of one input is a pipeline of one source: it runs as one, at no cost
            (_, source), ((_, given_watermark),) = inputs[0], watermarks
            inputs, watermarks = (), ()
        keys = sorted({op.key_column for op in ops if op.keyed})
        if len(keys) > 1:
            raise ConfigError(
                "operators",
                uids,
                "a chain keyed by one column (the rows are routed to subtasks by it before "
                f"the first operator; these are keyed by {', '.join(map(repr, keys))}: "
                "re-key them in stages of their own, operators=[Stage(...), Stage(...)])",
            )
        out = normalized(output)
        components = options.get("components", JobSpec.components) or None
        load_components(components)  # a ConfigError names it before anything runs
        watermark = None if inputs else given_watermark
        if watermark is not None and not isinstance(watermark, WatermarkStrategy):
            raise ConfigError(
                "watermark", watermark, "a WatermarkStrategy (e.g. forBoundedOutOfOrderness)"
            )
        if watermark is not None and any(
            k.lower().startswith("watermark.") for k in (source or {})
        ):
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
        transform = _transform(options.get("transform"), named, inputs)
        sides = _side_outputs(options.get("outputs"), every, out, late, inputs)
        stages = _stage_outputs(stages, out, late, sides, inputs)
        return JobSpec(
            dict(source or {}),
            ops,
            out,
            options.get("parallelism", JobSpec.parallelism),  # the fields' defaults
            options.get("pipelined", JobSpec.pipelined),
            options.get("tracer", JobSpec.tracer),
            where,
            transform,
            components,
            watermark,
            late,
            inputs,
            watermarks,
            sides,
            stages,
        )


def _transform(
    given: object, named: Mapping[str, Source] | None, inputs: tuple[tuple[str, Source], ...]
) -> Callable[[Any], Any] | Mapping[str, Callable[[Any], Any]] | None:
    """The job's transform, checked: one function for one source (or a graph of one input,
    which runs as one source); per input name, a function, for several inputs."""
    if given is None:
        return None
    if not inputs:  # one source, or named inputs collapsed into one
        if isinstance(given, Mapping):
            names = sorted(named or {})
            if sorted(given) != names or len(names) != 1:
                raise ConfigError(
                    "transform", sorted(given), "one function (the pipeline has one source)"
                )
            given = next(iter(given.values()))
        if not callable(given):
            raise ConfigError("transform", given, "a function of the source DataFrame")
        return given  # type: ignore[no-any-return]
    if not isinstance(given, Mapping):
        raise ConfigError(
            "transform",
            given,
            "a function per input name (transform={'clicks': f}): each input has columns of "
            "its own",
        )
    names = [n for n, _ in inputs]
    for name, function in given.items():
        if name not in names:
            raise ConfigError("transform", name, f"an input of sources: {', '.join(names)}")
        if not callable(function):
            raise ConfigError(f"transform[{name!r}]", function, "a function of a DataFrame")
    return dict(given)


def _stages(operators: Operators) -> tuple[Stage, ...]:
    """The stages of a job of several (``operators=[Stage(...), ...]``), named; empty for a
    job of one stage given as operators. One Stage is a job of one stage."""
    if isinstance(operators, (KeyedOperator, Stage)):
        given: list[object] = [operators]
    else:
        given = list(operators)
    if not any(isinstance(s, Stage) for s in given):
        return ()
    if not all(isinstance(s, Stage) for s in given):
        raise ConfigError(
            "operators",
            [type(s).__name__ for s in given],
            "operators, or stages (Stage(...) objects), not both",
        )
    stages: list[Stage] = [s for s in given if isinstance(s, Stage)]
    names = [s.name or f"stage_{i + 1}" for i, s in enumerate(stages)]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError("Stage.name", repeated[0], "stages of distinct names")
    for stage in stages[1:]:
        first = stage.operators[0]
        if isinstance(first, KeyedCoOperator) or any(
            isinstance(op, KeyedCoOperator) for op in stage.operators
        ):
            raise ConfigError(
                f"Stage({stage.name!r})",
                first.uid,
                "an operator over several inputs only first in the first stage (a later "
                "stage reads the one stage before it)",
            )
    for before, stage in pairwise(stages):
        emitted = before.operators[-1].output_schema
        if emitted is not None and stage.key_column not in emitted.names:
            raise ConfigError(
                f"Stage({stage.name!r})",
                stage.key_column,
                f"a key column of the rows the stage before it emits: {emitted.names}",
            )
    named = []
    for name, stage in zip(names, stages, strict=True):
        copy = Stage(
            stage.operators,
            name=name,
            parallelism=stage.parallelism,
            max_parallelism=stage.max_parallelism,
            output=stage.output,
            event_time=stage.event_time,
        )
        named.append(copy)
    return tuple(named)


def _stage_outputs(
    stages: tuple[Stage, ...],
    output: str,
    late: str | None,
    sides: tuple[tuple[str, str], ...],
    inputs: tuple[tuple[str, Source], ...],
) -> tuple[Stage, ...]:
    """*stages* with their own output tables made absolute, each checked: not the last
    stage's (its output is the job's), another table than every other output's and than a
    Delta or files input's."""
    if not stages:
        return ()
    if stages[-1].output is not None:
        raise ConfigError(
            f"Stage({stages[-1].name!r}).output",
            stages[-1].output,
            "no value: the last stage's output goes to the job's output",
        )
    taken = {output: "the output"}
    if late is not None:
        taken[late] = "the late output"
    for name, table in sides:
        taken[table] = f"output {name!r}"
    for name, source in inputs:
        found = source.get("path")
        if found:
            taken[normalized(str(found))] = f"input {name!r}"
    placed = []
    for stage in stages:
        own = None if stage.output is None else normalized(stage.output)
        if own is not None:
            if own in taken:
                raise ConfigError(
                    f"Stage({stage.name!r}).output",
                    stage.output,
                    f"another table than {taken[own]}",
                )
            taken[own] = f"the output of stage {stage.name!r}"
        placed.append(
            Stage(
                stage.operators,
                name=stage.name,
                parallelism=stage.parallelism,
                max_parallelism=stage.max_parallelism,
                output=own,
                event_time=stage.event_time,
            )
        )
    return tuple(placed)


def _side_outputs(
    outputs: Mapping[str, str] | None,
    operators: tuple[KeyedOperator, ...],
    output: str,
    late: str | None,
    inputs: tuple[tuple[str, Source], ...],
) -> tuple[tuple[str, str], ...]:
    """The named outputs and their tables, checked: each a name some operator declares
    (``side_outputs``), each table another than every other output's and than a Delta or
    files input's."""
    from spark_ckpt.sources.inputs import check_input_name

    if not outputs:
        return ()
    if not isinstance(outputs, Mapping):
        raise ConfigError("outputs", outputs, "a mapping of output names to Delta table paths")
    declared = {name for op in operators for name in op.side_outputs}
    taken = {output: "the output"}
    if late is not None:
        taken[late] = "the late output"
    for name, source in inputs:
        path = source.get("path")
        if path:
            taken[normalized(str(path))] = f"input {name!r}"
    sides: list[tuple[str, str]] = []
    for name, path in outputs.items():
        check_input_name(name, "outputs")
        if name not in declared:
            raise ConfigError(
                "outputs",
                name,
                f"a named output an operator declares (side_outputs): {sorted(declared)}",
            )
        if not isinstance(path, str) or not path:
            raise ConfigError(f"outputs[{name!r}]", path, "the path of a Delta table")
        table = normalized(path)
        if table in taken:
            raise ConfigError(f"outputs[{name!r}]", path, f"another table than {taken[table]}")
        taken[table] = f"output {name!r}"
        sides.append((name, table))
    return tuple(sides)


def _inputs(
    named: Mapping[str, Source] | None,
    watermark: object,
    operators: tuple[KeyedOperator, ...],
) -> tuple[tuple[tuple[str, Source], ...], tuple[tuple[str, WatermarkStrategy | None], ...]]:
    """The named inputs and each one's watermark strategy, checked against the first
    operator: an operator over several inputs reads exactly the pipeline's inputs; a one-input
    operator reads their union. Nothing without named inputs."""
    from spark_ckpt.sources.inputs import check_input_name

    if named is None:
        return (), ()
    if not isinstance(named, Mapping) or not named:
        raise ConfigError("sources", named, "a mapping of input names to source options")
    inputs: list[tuple[str, Source]] = []
    for name, options in named.items():
        check_input_name(name)
        if not isinstance(options, Mapping):
            raise ConfigError(f"sources[{name!r}]", options, "the input's ckpt-source options")
        stray = [k for k in options if str(k).lower().startswith("watermark.")]
        if stray:
            raise ConfigError(
                f"sources[{name!r}].{stray[0]}",
                options[stray[0]],
                "no value: give the input's strategy as watermark={name: WatermarkStrategy}",
            )
        inputs.append((name, dict(options)))
    names = [n for n, _ in inputs]
    first = operators[0]
    if isinstance(first, KeyedCoOperator):
        unknown = [n for n in first.inputs if n not in names]
        if unknown:
            raise ConfigError(
                f"operator {first.uid!r}", unknown[0], f"an input of sources: {', '.join(names)}"
            )
        unread = [n for n in names if n not in first.inputs]
        if unread:
            raise ConfigError(
                "sources",
                unread[0],
                f"inputs that operator {first.uid!r} reads: {list(first.inputs)}",
            )
    if watermark is None or isinstance(watermark, WatermarkStrategy):
        strategies = {n: watermark for n in names}
    elif isinstance(watermark, Mapping):
        unknown = [n for n in watermark if n not in names]
        if unknown:
            raise ConfigError("watermark", unknown[0], f"an input of sources: {', '.join(names)}")
        strategies = {n: watermark.get(n) for n in names}
    else:
        raise ConfigError("watermark", watermark, "a WatermarkStrategy, or one per input name")
    for name, strategy in strategies.items():
        if strategy is not None and not isinstance(strategy, WatermarkStrategy):
            raise ConfigError(f"watermark[{name!r}]", strategy, "a WatermarkStrategy")
    given = [s for s in strategies.values() if s is not None]
    if given and len(given) < len(names):
        missing = [n for n, s in strategies.items() if s is None]
        raise ConfigError(
            "watermark",
            missing[0],
            "a strategy for every input, or for none (event time is kept for all or none)",
        )
    if len({s.allowed_lateness_ms for s in given}) > 1:
        raise ConfigError(
            "watermark",
            [s.allowed_lateness_ms for s in given],
            "one allowed lateness for every input",
        )
    if len({s.event_time for s in given}) > 1:
        raise ConfigError("watermark", "no_watermarks()", "event time on every input, or on none")
    return tuple(inputs), tuple(strategies.items())
