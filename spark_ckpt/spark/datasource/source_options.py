"""Options of ``spark.readStream.format("ckpt-source")``, parsed and validated in one place.

Parsed where they are given — the user's process (the pipeline API validates before
``load()``, so errors are :class:`~spark_ckpt.errors.ConfigError` naming the option) and again
inside Spark's source runner. Keys are case-insensitive (Spark lower-cases them).

The user's options — ``pipeline`` (required), ``store`` (default
``./spark-ckpt-data/<pipeline>``, made absolute), ``source`` (``generator``, ``delta``,
``kafka`` or ``files``), ``maxRowsPerTrigger``, ``barrierPlacement``
(:class:`~spark_ckpt.sources.stream_offset.BarrierPlacement`), each source's own (see
:mod:`spark_ckpt.sources.generator`, :mod:`spark_ckpt.delta.tail_driver`,
:mod:`spark_ckpt.sources.kafka_options`, :mod:`spark_ckpt.kafka.kafka_source`,
:mod:`spark_ckpt.sources.files.files_options`) and the checkpoint
configuration (``checkpoint.*``, ``execution.checkpointing.*``, ``restart-strategy*``,
``state.*``, ``savepoint.*``: :class:`~spark_ckpt.runtime.config.CheckpointConfig`) — are
described in README.md, *Options*. The pipeline sets the others, never a user:

* ``run``: set by :meth:`Pipeline.run <spark_ckpt.pipeline.pipeline.Pipeline.run>` for each
  attempt (:mod:`spark_ckpt.coordination.runs`);
* ``route.key``, ``route.parallelism``, ``route.maxParallelism``, ``route.partitions``: set
  when the subtasks run on the executors, so the source's rows leave ``read()`` routed to
  them (:mod:`spark_ckpt.spark.executors.routing`);
* ``components``: ``module:name`` of the job's
  :class:`~spark_ckpt.runtime.components.Components`, from the job's ``components``;
* ``storage.secret``: the pipeline's explicit storage options
  (:mod:`spark_ckpt.locations.credentials`; a key Spark redacts wherever it shows options).

Through :meth:`Pipeline.read <spark_ckpt.pipeline.pipeline.Pipeline.read>` and the source of
:meth:`Pipeline.run <spark_ckpt.pipeline.pipeline.Pipeline.run>`/``start``, the pipeline sets
``pipeline``, ``store``, ``run``, ``components`` and the checkpoint configuration itself (from
its ``CheckpointConfig``): a source option that says otherwise is a
:class:`~spark_ckpt.errors.ConfigError` (:func:`check_pipeline_options`), never silently
overridden.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from spark_ckpt.errors import ConfigError
from spark_ckpt.locations.credentials import NO_STORAGE_OPTIONS, StorageOptions
from spark_ckpt.locations.credentials import OPTION as STORAGE_OPTION
from spark_ckpt.locations.uris import normalized
from spark_ckpt.protocol.option import parse_int
from spark_ckpt.runtime.components import Components, load_components
from spark_ckpt.runtime.config import (
    RESERVED_PREFIXES,
    CheckpointConfig,
    CheckpointingMode,
    parse_option,
)
from spark_ckpt.runtime.event_time import OPTIONS as WATERMARK_OPTIONS
from spark_ckpt.runtime.event_time import WatermarkStrategy
from spark_ckpt.sources.files.files_options import OPTION_KEYS as FILES_OPTION_KEYS
from spark_ckpt.sources.files.files_options import FilesSpec
from spark_ckpt.sources.generator import GeneratorSpec
from spark_ckpt.sources.inputs import Inputs
from spark_ckpt.sources.kafka_options import OPTION_KEYS as KAFKA_OPTION_KEYS
from spark_ckpt.sources.kafka_options import PINNED, KafkaOptions
from spark_ckpt.sources.kafka_options import PREFIX as KAFKA_PREFIX
from spark_ckpt.sources.stream_offset import BarrierPlacement, SourceAlignment
from spark_ckpt.spark.executors.routing import (
    ROUTE_KEY,
    ROUTE_MAX_PARALLELISM,
    ROUTE_OPTIONS,
    ROUTE_PARALLELISM,
    ROUTE_PARTITIONS,
    Router,
)

SOURCE_KINDS: Final = ("generator", "delta", "kafka", "files")
#: ``source=inputs``: several named inputs (:mod:`spark_ckpt.sources.inputs_source`), the
#: option :data:`INPUTS` set by the pipeline from ``Pipeline.run(sources=...)``.
INPUTS_KIND: Final = "inputs"
INPUTS: Final = "inputs"
#: The lookup tables of the job's lookup joins (a JSON list of paths, set by the pipeline): the
#: source records the version of each that a micro-batch joins with in its offsets.
LOOKUP_TABLES: Final = "lookup.tables"
#: The option naming the job's components (:mod:`spark_ckpt.runtime.components`).
COMPONENTS: Final = "components"
_ROUTE_KEYS: Final = frozenset(k.lower() for k in ROUTE_OPTIONS)
_WATERMARK_KEYS: Final = frozenset(k.lower() for k in WATERMARK_OPTIONS)
_OWN_KEYS: Final = (
    frozenset(
        {
            "pipeline",
            "store",
            "source",
            "maxrowspertrigger",
            "barrierplacement",
            "run",
            COMPONENTS,
            LOOKUP_TABLES,
        }
    )
    | _ROUTE_KEYS
    | _WATERMARK_KEYS
    | {STORAGE_OPTION}
)
#: Options of the whole ``ckpt-source`` that an input's own options may not set.
_PIPELINE_KEYS: Final = _OWN_KEYS - {"source", "maxrowspertrigger"}
_DELTA_KEYS: Final = frozenset({"path", "channels", "startingversion"})
_GENERATOR_KEYS: Final = frozenset(k.lower() for k in GeneratorSpec.OPTION_KEYS)
DISCOVERY_INTERVAL_NAME: Final = "partitionDiscoveryIntervalMs"
DISCOVERY_INTERVAL: Final = DISCOVERY_INTERVAL_NAME.lower()
#: Kafka partition discovery every 10 s unless set.
DEFAULT_DISCOVERY_INTERVAL_MS: Final = 10_000
#: ``source=kafka``: Spark's Kafka options (``kafka.*`` aside), how often the source runner
#: looks for new partitions, and the partitions the pipeline pins for a run.
_KAFKA_KEYS: Final = KAFKA_OPTION_KEYS | {DISCOVERY_INTERVAL, PINNED}
DEFAULT_STORE_DIR: Final = "spark-ckpt-data"


def default_root(pipeline: str) -> str:
    return os.path.abspath(os.path.join(DEFAULT_STORE_DIR, pipeline))


#: Where a pipeline's checkpoint options are set (the end of a conflict's message).
_SET_THERE = (
    "the pipeline's configuration decides it: set it in the CheckpointConfig given to "
    "Pipeline(spark, name, config=...), or leave it out of the source options"
)


def check_pipeline_options(
    options: Mapping[str, object], config: CheckpointConfig, *, pipeline: str, root: str
) -> None:
    """Check the ``ckpt-source`` options given to the pipeline *pipeline* (root *root*,
    configuration *config*) against what the pipeline sets itself. A checkpoint option
    (``checkpoint.*``, ``savepoint.*``, ``restart-strategy*``, ``state.*``,
    ``execution.checkpointing.*``, any spelling) must have the configuration's value (after
    parsing: ``1000`` and ``1s`` agree); ``pipeline`` and ``store`` must name this pipeline
    and its root; ``run`` is the pipeline's own. Anything else raises :class:`ConfigError`
    naming the option, both values and where to set it; an invalid value raises the error it
    gets anyway (:func:`~spark_ckpt.runtime.config.parse_option`)."""
    own = config.to_options()  # canonical keys: every option the configuration sets
    for key, raw in options.items():
        value = str(raw)
        lowered = key.strip().lower()
        if lowered == "pipeline" and value.strip() != pipeline:
            raise ConfigError(key, raw, f"{pipeline!r}, the name of this pipeline (or no value)")
        if lowered == "store" and _absolute(value) != _absolute(root):
            raise ConfigError(
                key, raw, f"{root!r}, this pipeline's root (set it with Pipeline(..., root=...))"
            )
        if lowered == "run":
            raise ConfigError(key, raw, "no value: each run of a pipeline sets its own")
        if lowered == COMPONENTS:
            raise ConfigError(key, raw, "no value: name them with the job's components=")
        if lowered in _ROUTE_KEYS:
            raise ConfigError(key, raw, "no value: the pipeline routes its rows itself")
        if lowered == LOOKUP_TABLES:
            raise ConfigError(key, raw, "no value: the pipeline names its lookup joins' tables")
        if lowered == STORAGE_OPTION:
            raise ConfigError(key, "(hidden)", "no value: give Pipeline(..., storage_options=)")
        parsed = parse_option(key, value)
        if parsed is None:
            continue
        canonical, mine = parsed
        theirs = own.get(canonical)
        if theirs is not None and parse_option(canonical, theirs) == (canonical, mine):
            continue
        # a value out of range fails as it would anyway (ranges are checked on the config)
        scoped = canonical.split(".")[1] if canonical.startswith("restart-strategy.") else None
        CheckpointConfig.from_options(
            {key: value, **({"restart-strategy": scoped} if scoped else {})}
        )
        if theirs is not None:
            pipeline_value = f"{theirs!r} ({canonical} of the pipeline's configuration)"
        elif canonical.startswith("restart-strategy."):
            kind = own.get("restart-strategy")
            pipeline_value = f"no value (the pipeline's restart-strategy is {kind!r})"
        else:
            pipeline_value = f"no value ({canonical} is unset in the pipeline's configuration)"
        raise ConfigError(key, raw, f"{pipeline_value}: {_SET_THERE}")


def _absolute(path: str) -> str:
    return path.rstrip("/") if "://" in path else os.path.abspath(path)


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
    #: ``source=kafka``: its options (lower-cased keys, ``kafka.*`` included)
    kafka: dict[str, str] = field(default_factory=dict)
    #: ``source=files``: its options (lower-cased keys)
    files: dict[str, str] = field(default_factory=dict)
    #: ``source=kafka``: how often the source runner looks for new partitions (0: never)
    discovery_interval_ms: int = 0
    raw: dict[str, str] = field(default_factory=dict)
    run_id: str | None = None
    #: the subtasks ``read()`` routes the rows to (the executor path), or None
    router: Router | None = None
    #: ``module:name`` of the job's components, or None (see :attr:`components`)
    components_name: str | None = None
    #: the pipeline keeps event time (``watermark.*``): the batches carry progress rows
    watermark: WatermarkStrategy | None = None
    #: the pipeline's explicit storage options (:data:`STORAGE_OPTION`), for the buckets of
    #: the root and the source; installed by whoever opens the source
    storage: StorageOptions = NO_STORAGE_OPTIONS
    #: ``source=inputs``: the inputs, and each one's own options (parsed), in channel order
    inputs: Inputs | None = None
    input_options: tuple[SourceOptions, ...] = ()
    #: the lookup joins' tables, whose versions the micro-batches record (:data:`LOOKUP_TABLES`)
    lookup_tables: tuple[str, ...] = ()

    @property
    def components(self) -> Components:
        """The job's components (:mod:`spark_ckpt.runtime.components`), resolved in the
        calling process."""
        return load_components(self.components_name)

    @property
    def alignment(self) -> SourceAlignment:
        """How ``latestOffset`` places and aligns barriers: the placement option and the
        configuration's alignment (see :mod:`spark_ckpt.sources.stream_offset`)."""
        return source_alignment(self.config, self.barrier_placement)

    @staticmethod
    def parse(options: Mapping[str, str]) -> SourceOptions:
        opts = {str(k).strip().lower(): str(v) for k, v in options.items()}
        pipeline = opts.get("pipeline", "").strip()
        if not pipeline or "/" in pipeline or pipeline.startswith("."):
            raise ConfigError("pipeline", opts.get("pipeline"), "a non-empty name without '/'")
        source = opts.get("source", "generator").strip().lower()
        if source == INPUTS_KIND:
            return _parse_inputs(opts)
        if source not in SOURCE_KINDS:
            raise ConfigError("source", opts.get("source"), " or ".join(SOURCE_KINDS))
        kind_keys = {
            "generator": _GENERATOR_KEYS,
            "delta": _DELTA_KEYS,
            "kafka": _KAFKA_KEYS,
            "files": FILES_OPTION_KEYS,
        }
        allowed = _OWN_KEYS | kind_keys[source]
        for key in opts:
            if source == "kafka" and key.startswith(KAFKA_PREFIX):
                continue
            if key not in allowed and not key.startswith(RESERVED_PREFIXES):
                raise ConfigError(
                    key, opts[key], f"a ckpt-source option for source={source}: {sorted(allowed)}"
                )
        if source == "kafka" and "maxrowspertrigger" in opts:
            raise ConfigError(
                "maxRowsPerTrigger",
                opts["maxrowspertrigger"],
                "maxOffsetsPerTrigger (source=kafka)",
            )
        limit_text = opts.get("maxrowspertrigger", opts.get("maxoffsetspertrigger"))
        limit: int | None = None
        if limit_text is not None:
            try:
                limit = int(limit_text)
            except ValueError:
                limit = 0
            if limit < 1:
                name = "maxOffsetsPerTrigger" if source == "kafka" else "maxRowsPerTrigger"
                raise ConfigError(name, limit_text, "a positive integer")
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
        kafka: dict[str, str] = {}
        discovery_ms = DEFAULT_DISCOVERY_INTERVAL_MS
        if source == "kafka":
            kafka = {k: v for k, v in opts.items() if k in _KAFKA_KEYS or k.startswith("kafka.")}
            KafkaOptions.parse(kafka)  # errors name the option, before anything runs
            if DISCOVERY_INTERVAL in opts:
                discovery_ms = parse_int(DISCOVERY_INTERVAL_NAME, opts[DISCOVERY_INTERVAL])
                if discovery_ms < 0:
                    raise ConfigError(
                        DISCOVERY_INTERVAL_NAME,
                        opts[DISCOVERY_INTERVAL],
                        "an integer >= 0 (0: off)",
                    )
        files: dict[str, str] = {}
        if source == "files":
            files = {k: v for k, v in opts.items() if k in FILES_OPTION_KEYS}
            FilesSpec.from_options(files)  # errors name the option, before anything runs
        if source == "delta" and "path" not in delta:
            raise ConfigError("path", None, "the path of the Delta table to tail (source=delta)")
        watermark = WatermarkStrategy.from_options(
            {k: v for k, v in opts.items() if k in _WATERMARK_KEYS}
        )
        storage = (
            StorageOptions.from_json(opts[STORAGE_OPTION])
            if STORAGE_OPTION in opts
            else StorageOptions()
        ).covering(
            root,
            delta.get("path"),
            files.get("path"),
            files.get("sourcearchivedir"),
            files.get("badrecordspath"),
        )
        return SourceOptions(
            pipeline=pipeline,
            root=normalized(root),
            source=source,
            max_rows_per_trigger=limit,
            config=config,
            barrier_placement=placement,
            generator=generator,
            delta=delta,
            kafka=kafka,
            files=files,
            discovery_interval_ms=discovery_ms,
            raw={k: v for k, v in opts.items() if k != STORAGE_OPTION},
            run_id=opts.get("run") or None,
            router=_router(opts, watermark),
            components_name=_components(opts),
            watermark=watermark,
            storage=storage,
            lookup_tables=_lookup_tables(opts),
        )


def _lookup_tables(opts: Mapping[str, str]) -> tuple[str, ...]:
    """The :data:`LOOKUP_TABLES` option: a JSON list of table paths (none: no lookup join)."""
    import json

    text = opts.get(LOOKUP_TABLES)
    if not text:
        return ()
    try:
        tables = json.loads(text)
    except ValueError as e:
        raise ConfigError(LOOKUP_TABLES, text, "a JSON list of Delta table paths") from e
    if not isinstance(tables, list) or not all(isinstance(t, str) and t for t in tables):
        raise ConfigError(LOOKUP_TABLES, text, "a JSON list of Delta table paths")
    return tuple(tables)


def _parse_inputs(opts: dict[str, str]) -> SourceOptions:
    """``source=inputs``: the :data:`INPUTS` option (a JSON list of ``{"name", "channels",
    "key", "time", "options"}``, set by the pipeline) and the options of the whole source.
    Each input's options are parsed as a source of their own, with the pipeline's name, root
    and configuration; they may not set what belongs to the whole source."""
    import json

    from spark_ckpt.sources.inputs import InputSpec

    text = opts.get(INPUTS)
    try:
        items = json.loads(text or "")
        specs = [
            (
                InputSpec(
                    str(i["name"]),
                    int(i["channels"]),
                    i.get("key"),
                    i.get("time"),
                    bool(i.get("transformed", False)),
                ),
                {str(k): str(v) for k, v in dict(i["options"]).items()},
            )
            for i in items
        ]
    except (TypeError, ValueError, KeyError) as e:
        raise ConfigError(INPUTS, text, "the inputs as the pipeline sets them (sources=)") from e
    shared = {k: v for k, v in opts.items() if k != INPUTS and k != "source"}
    parsed_inputs: list[SourceOptions] = []
    for spec, own in specs:
        stray = [k for k in own if k.strip().lower() in _PIPELINE_KEYS]
        if stray:
            raise ConfigError(
                f"sources.{spec.name}.{stray[0]}",
                own[stray[0]],
                "no value: it is the pipeline's, set for every input at once",
            )
        inner: dict[str, str] = {
            **{k: v for k, v in shared.items() if k.startswith(RESERVED_PREFIXES)},
            **own,
            **{k: shared[k] for k in ("pipeline", "store", STORAGE_OPTION) if k in shared},
        }
        parsed_inputs.append(SourceOptions.parse(inner))
    inputs = Inputs(tuple(spec for spec, _ in specs))
    base = SourceOptions.parse({k: v for k, v in shared.items()})
    limits = [p.max_rows_per_trigger for p in parsed_inputs if p.max_rows_per_trigger]
    # the Kafka inputs' partitions are looked for as often as the most eager of them asks
    intervals = [
        p.discovery_interval_ms
        for p in parsed_inputs
        if p.source == "kafka" and p.discovery_interval_ms > 0
    ]
    return replace(
        base,
        source=INPUTS_KIND,
        discovery_interval_ms=min(intervals) if intervals else 0,
        # the inputs' limits add up, shared fairly over all their channels
        max_rows_per_trigger=sum(limits) if limits else base.max_rows_per_trigger,
        raw={k: v for k, v in opts.items() if k != STORAGE_OPTION},
        inputs=inputs,
        input_options=tuple(parsed_inputs),
        storage=StorageOptions(
            base.storage.options,
            tuple(
                sorted(
                    {*base.storage.buckets, *(b for p in parsed_inputs for b in p.storage.buckets)}
                )
            ),
        ),
    )


def _components(opts: Mapping[str, str]) -> str | None:
    """The ``components`` option, checked to name :class:`Components` (None: not set)."""
    name = opts.get(COMPONENTS, "").strip() or None
    load_components(name)  # a ConfigError names the option, before anything runs
    return name


def _router(opts: Mapping[str, str], watermark: WatermarkStrategy | None) -> Router | None:
    """The ``route.*`` options (lower-cased keys) as a router; all or none. With event time,
    it fills in the channels' progress from the event-time column (the rows it routes are
    the source's: the pipeline routes after a transformation itself)."""
    given = {k: opts[k.lower()] for k in ROUTE_OPTIONS if k.lower() in opts}
    if not given:
        return None
    missing = [k for k in ROUTE_OPTIONS if k not in given]
    if missing:
        raise ConfigError(missing[0], None, f"a value: {', '.join(ROUTE_OPTIONS)} go together")
    numbers = {}
    for key in (ROUTE_PARALLELISM, ROUTE_MAX_PARALLELISM, ROUTE_PARTITIONS):
        try:
            numbers[key] = int(given[key])
        except ValueError:
            numbers[key] = 0
        if numbers[key] < 1:
            raise ConfigError(key, given[key], "a positive integer")
    if numbers[ROUTE_PARALLELISM] > numbers[ROUTE_MAX_PARALLELISM]:
        raise ConfigError(
            ROUTE_PARALLELISM, given[ROUTE_PARALLELISM], f"at most {ROUTE_MAX_PARALLELISM}"
        )
    return Router(
        given[ROUTE_KEY],
        numbers[ROUTE_PARALLELISM],
        numbers[ROUTE_MAX_PARALLELISM],
        numbers[ROUTE_PARTITIONS],
        None if watermark is None else watermark.column,
    )


def source_alignment(
    config: CheckpointConfig, placement: BarrierPlacement = BarrierPlacement.READ
) -> SourceAlignment:
    """The source's alignment for *config*: the aligned-checkpoint timeout applies to
    exactly-once unaligned checkpointing only (as in Flink), and at-least-once barriers
    never wait."""
    at_least_once = config.mode is CheckpointingMode.AT_LEAST_ONCE
    timeout = config.aligned_checkpoint_timeout_ms if config.unaligned and not at_least_once else 0
    return SourceAlignment(placement, timeout, at_least_once)
