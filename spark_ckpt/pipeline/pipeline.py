"""The user-facing API: a checkpointed streaming pipeline on Spark.

.. code-block:: python

    from spark_ckpt import CheckpointConfig, Pipeline, RunningCount

    pipeline = Pipeline(spark, "orders", config=CheckpointConfig(interval_ms=1000))
    pipeline.run(
        {"source": "generator", "channels": 4, "rate": 10_000},   # ckpt-source options
        RunningCount("counter", "user_id"),                       # operators
        output="/lake/counts",                                    # exactly-once Delta output
        duration_s=60,
    )
    pipeline.client.savepoint()       # from this or any other process: PipelineClient(root)

    # stateless, straight into Delta with two-phase commit:
    pipeline.read(source="generator", channels=4).writeStream.format("ckpt-sink") \\
        .option("pipeline", "orders").option("path", "/lake/orders_out").start()

:meth:`Pipeline.run` takes the *description* of the job (a
:class:`~spark_ckpt.pipeline.job.JobSpec`: source options, operators, output), never a prebuilt
stateful object: every attempt (the first, and each restart the restart strategy allows, see
:mod:`~spark_ckpt.pipeline.supervisor`) is a new *run* (:mod:`spark_ckpt.coordination.runs`) that
builds its own foreachBatch function, coordinator and sink recovery, all restoring from the same
checkpoint: the latest completed one whose data verifies. :meth:`Pipeline.start` starts one run and
hands back its :class:`~spark_ckpt.pipeline.pipeline_run.PipelineRun`. Requests and queries
(checkpoint, savepoint, stop, list, stats) go through the
:class:`~spark_ckpt.client.pipeline_client.PipelineClient`, which the CLI and notebooks use too.

Everything of a pipeline lives under one root (default ``checkpoint.storage`` when set,
else ``./spark-ckpt-data/<name>``): the Delta checkpoint store, the coordinator's mailbox, the
runs' files, and the Spark checkpoint locations of its query runs. Each run gets a fresh
Spark checkpoint location: the truth is the spark-ckpt checkpoint store, from which every run
restores (rewinding the source channels to their barrier positions), as a Flink job restores
from its latest checkpoint.

Works with classic Spark and with Spark Connect (``SparkSession.builder.remote(...)``): the
foreachBatch function is a picklable spec that builds its runtime in the process that runs
it, and nothing here uses ``SparkContext``. Runs in the user's driver process (the Connect
client). Imports pyspark lazily.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Unpack

import pyarrow as pa
import pyarrow.fs as pafs

from spark_ckpt.client.pipeline_client import PipelineClient
from spark_ckpt.coordination.heartbeats import mark_starting
from spark_ckpt.coordination.runs import RunFiles, Runs, RunState, new_run_id
from spark_ckpt.coordination.topology import SinkSpec, Topology, write_topology
from spark_ckpt.delta.commit_safety import check_commit_safety
from spark_ckpt.delta.lookup_join import LookupJoin
from spark_ckpt.delta.sink_committer import DeltaSinkCommitter
from spark_ckpt.delta.sink_target import DeltaSinkTarget
from spark_ckpt.errors import ConfigError
from spark_ckpt.locations.credentials import OPTION as STORAGE_OPTION
from spark_ckpt.locations.credentials import StorageOptions
from spark_ckpt.locations.preflight import check_readable, check_writable
from spark_ckpt.locations.uris import filesystem, is_remote, normalized
from spark_ckpt.pipeline.interrupts import Interrupts
from spark_ckpt.pipeline.job import JobOptions, JobSpec, Operators, Placement, Source
from spark_ckpt.pipeline.pipeline_run import PipelineRun, RunFunction
from spark_ckpt.pipeline.restore_point import prepare_restore
from spark_ckpt.pipeline.supervisor import RunResult, RunSupervisor, StopReason
from spark_ckpt.pipeline.transform import RouteBatches, apply_input_transforms, apply_transform
from spark_ckpt.protocol.barrier import BARRIER_COLUMNS
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.runtime.aligner import AlignmentMode
from spark_ckpt.runtime.co_operator import KeyedCoOperator
from spark_ckpt.runtime.components import Components, load_components
from spark_ckpt.runtime.config import CheckpointConfig, CheckpointingMode
from spark_ckpt.runtime.event_time import WatermarkStrategy
from spark_ckpt.runtime.operator import KeyedOperator, chain_key
from spark_ckpt.runtime.restore_settings import PipelineShape, RestoreSettings
from spark_ckpt.runtime.stage import STAGE_PREFIX, Stage, stage_output_name
from spark_ckpt.runtime.task import CHAIN_VERTEX, SOURCE_TASK
from spark_ckpt.runtime.task_time import time_needed
from spark_ckpt.sources.inputs import INPUT_KEY, Inputs, same_schemas
from spark_ckpt.sources.kafka_options import PINNED
from spark_ckpt.spark.datasource.channel_sources import open_channel_source, user_schema
from spark_ckpt.spark.datasource.source_options import (
    COMPONENTS,
    LOOKUP_TABLES,
    SourceOptions,
    check_pipeline_options,
    default_root,
)
from spark_ckpt.spark.driver.foreach_batch import ForeachBatchFunction
from spark_ckpt.spark.executors.changelog import remove_run
from spark_ckpt.spark.executors.routing import ROUTED_DDL, Router
from spark_ckpt.spark.executors.shipping import ship_by_value
from spark_ckpt.spark.executors.subtask_function import SubtaskFunction
from spark_ckpt.spark.executors.subtask_query import output_mode, subtask_query
from spark_ckpt.spark.session.query_settings import (
    ROUTING_SETTINGS,
    STAGES_SETTINGS,
    query_settings,
)
from spark_ckpt.spark.session.quiet_stop import silence_task_kill_logs
from spark_ckpt.spark.subtask_spec import AlignerSpec, StageRole

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    from spark_ckpt.delta.delta_store import DeltaCheckpointStore

log = logging.getLogger(__name__)


def register_data_sources(spark: SparkSession) -> None:
    """Register ``ckpt-source``, ``ckpt-sink`` and ``ckpt-state`` (batch reads of checkpoint
    and savepoint state) explicitly (auto-registration needs the ``pyspark_*`` shims on the
    workers' path; this works everywhere, Spark Connect too). Also drops Spark's log lines
    about tasks a query stop kills (:mod:`spark_ckpt.spark.session.quiet_stop`)."""
    from datasources.ckpt_sink import CkptSink
    from datasources.ckpt_source import CkptSource
    from datasources.ckpt_state import CkptStateSource

    spark.dataSource.register(CkptSource)
    spark.dataSource.register(CkptSink)
    spark.dataSource.register(CkptStateSource)
    silence_task_kill_logs(spark)


def alignment_mode(config: CheckpointConfig) -> AlignmentMode:
    """The subtasks' aligner mode that implements *config*. The aligned-checkpoint timeout
    is applied by the source, which cuts lagging channels
    (:func:`~spark_ckpt.spark.datasource.source_options.source_alignment`)."""
    if config.mode is CheckpointingMode.AT_LEAST_ONCE:
        return AlignmentMode.AT_LEAST_ONCE
    if config.unaligned and config.aligned_checkpoint_timeout_ms == 0:
        return AlignmentMode.UNALIGNED
    return AlignmentMode.ALIGNED


@dataclass(frozen=True)
class PreparedRun:
    """A run whose query is not started yet (see :meth:`Pipeline.prepare`)."""

    run_id: str
    dataframe: DataFrame
    function: RunFunction
    files: RunFiles
    #: SQL settings of the run's query alone (:mod:`spark_ckpt.spark.session.query_settings`)
    settings: Mapping[str, str] = field(default_factory=dict)

    def stream_writer(self) -> DataStreamWriter:
        """The run's query, not started: the ``foreachBatch`` function over the source, or
        (subtasks on executors) the subtasks' stateful query into ``noop``."""
        if isinstance(self.function, SubtaskFunction):
            query = subtask_query(self.dataframe, self.function)
            mode = output_mode(self.function)
            writer: DataStreamWriter = query.writeStream.format("noop").outputMode(mode)
            return writer
        return self.dataframe.writeStream.foreachBatch(self.function)

    def start(self, writer: DataStreamWriter) -> StreamingQuery:
        """Start *writer* (from :meth:`stream_writer`) with the run's :attr:`settings`, which
        then hold for its query only."""
        with query_settings(self.dataframe.sparkSession, self.settings):
            return writer.start()


class Pipeline:
    """One checkpointed pipeline: a name, a root, a checkpoint configuration. Builds and
    starts runs of a job (:meth:`prepare`, :meth:`start`) and runs a job with restarts
    (:meth:`run`); :attr:`client` talks to it. Runs in the user's driver process."""

    def __init__(
        self,
        spark: SparkSession,
        name: str,
        *,
        config: CheckpointConfig | None = None,
        root: str | None = None,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        """*root*: the pipeline root (checkpoint store, mailbox, runs); by default the
        configuration's ``checkpoint.storage``, else ``./spark-ckpt-data/<name>``.
        *storage_options*: credentials and endpoints of the object stores the pipeline
        uses (its root, outputs, sources and savepoint directory), with delta-rs's keys
        (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``...), given
        to delta-rs and pyarrow in every process of the pipeline instead of the
        environment's; never logged, never written under the root
        (:mod:`spark_ckpt.locations.credentials`). Default: the environment's."""
        self.spark = spark
        self.name = name
        self.config = config or CheckpointConfig(interval_ms=1000)
        root = root or self.config.checkpoint_storage or default_root(name)
        self.root = normalized(root)
        #: explicit storage options for the buckets the pipeline uses (installed here)
        self.storage = StorageOptions.of(storage_options, [self.root, self.config.savepoint_dir])
        self.storage.install()
        check_commit_safety(self.root)
        check_writable(self.root)  # an object store: one clear line before anything runs
        #: requests (checkpoint, savepoint, stop) and queries (list, latest, stats)
        self.client = PipelineClient(self.root)
        self.driver_id = uuid.uuid4().hex
        self._run_ids: set[str] = set()
        register_data_sources(spark)

    @property
    def store(self) -> DeltaCheckpointStore:
        """The pipeline's checkpoint store."""
        return self.client.store

    def owns_run(self, run_id: str) -> bool:
        """Whether this driver started the run *run_id*."""
        return run_id in self._run_ids

    # -- building ---------------------------------------------------------------------------
    def source_options(self, **options: object) -> dict[str, str]:
        """The ``ckpt-source`` options of this pipeline: *options* with the pipeline's name, root
        and configuration. :class:`~spark_ckpt.errors.ConfigError` for an option that contradicts
        them (:func:`~spark_ckpt.spark.datasource.source_options.check_pipeline_options`)."""
        check_pipeline_options(options, self.config, pipeline=self.name, root=self.root)
        opts = {k: str(v) for k, v in options.items()}
        opts.update(self.config.to_options())
        opts.update(pipeline=self.name, store=self.root)
        if self.storage:
            opts[STORAGE_OPTION] = self.storage.to_json()
        return opts

    def sink_options(self, path: str, **options: object) -> dict[str, str]:
        """The ``ckpt-sink`` options of this pipeline writing to the Delta table *path*: its
        name and root, and its explicit storage options if it has any (Spark redacts their
        key), with *options* (``uid``) added:
        ``df.writeStream.format("ckpt-sink").options(**pipeline.sink_options(out))``."""
        opts = {k: str(v) for k, v in options.items()}
        opts.update(pipeline=self.name, store=self.root, path=path)
        if self.storage:
            self.storage = self.storage.covering(path)
            self.storage.install()
            opts[STORAGE_OPTION] = self.storage.to_json()
        return opts

    def state_options(self, uid: str, state: str, **options: object) -> dict[str, str]:
        """The ``spark.read.format("ckpt-state")`` options that read state *state* of the
        operator *uid* from this pipeline's root (or the ``path`` in *options*: a savepoint
        of it), with its explicit storage options if any, and *options* (``checkpoint``,
        ``partitions``) added."""
        opts = {"path": self.root, "uid": uid, "state": state}
        opts.update({k: str(v) for k, v in options.items()})
        if self.storage:
            self.storage = self.storage.covering(opts["path"])
            self.storage.install()
            opts[STORAGE_OPTION] = self.storage.to_json()
        return opts

    def filesystem(self, location: str) -> tuple[pafs.FileSystem, str]:
        """pyarrow's file system of *location* (a local path or a URI) and the path in it,
        with this pipeline's storage options (their buckets extended to *location*'s): to
        land files for ``source=files`` or look at what the pipeline wrote. Raises
        :class:`~spark_ckpt.errors.StoreError` naming *location*."""
        if self.storage:
            self.storage = self.storage.covering(location)
            self.storage.install()
        return filesystem(location)

    def read(self, **options: object) -> DataFrame:
        """``spark.readStream.format("ckpt-source")`` for this pipeline (for ``ckpt-sink``
        queries); options are validated here, raising
        :class:`~spark_ckpt.errors.ConfigError` naming a bad option, or one that contradicts
        the pipeline's configuration, name or root (see :meth:`source_options`)."""
        opts = self.source_options(**options)
        SourceOptions.parse(opts)
        return self.spark.readStream.format("ckpt-source").options(**opts).load()

    def prepare(
        self,
        source: Source | None,
        operators: Operators,
        *,
        output: str,
        **options: Unpack[JobOptions],
    ) -> PreparedRun:
        """Everything one run of the job needs before its query starts (see
        :class:`~spark_ckpt.pipeline.job.JobSpec` for the arguments). Callers that drive the
        query themselves (benchmarks) start ``dataframe`` with ``function`` (or a wrapper
        calling it) as the ``foreachBatch`` function. *tracer*: receives the run's engine
        spans where foreachBatch runs (picklable, cheap; see
        :mod:`spark_ckpt.protocol.trace`). *transform*: Spark SQL on the source DataFrame
        before the operators, called with a DataFrame that keeps the barrier rows
        (``lambda df: df.selectExpr("CAST(value AS STRING) AS json")...``; see
        :mod:`spark_ckpt.pipeline.transform`); an operation that cannot keep them raises
        :class:`~spark_ckpt.errors.ConfigError`."""
        return self._prepare(JobSpec.of(source, operators, output=output, **options))

    def _prepare(self, job: JobSpec) -> PreparedRun:
        """A run id, the run's topology (who acknowledges, which sink the coordinator
        commits), the ``ckpt-source`` DataFrame bound to the run, and the run's foreachBatch
        function."""
        self._cover(job)
        Runs(self.root).prune(on_ended=partial(remove_run, self.root))
        run_id = new_run_id()
        opts = self._job_source_options(job)
        lookups = _lookup_tables(job)
        if lookups:  # the source records the version of each that a micro-batch joins with
            opts[LOOKUP_TABLES] = json.dumps(lookups)
        if job.watermark is not None:
            opts.update(job.watermark.to_options())
        elif any(op.needs_processing_time for op in job.all_operators) and not any(
            k.lower().startswith("watermark.") for k in opts
        ):  # a lookup join picks its table's version by the batch's processing time
            opts.update(WatermarkStrategy.no_watermarks().to_options())
        opts["run"] = run_id
        parsed = SourceOptions.parse(opts)
        channels, names = _channels(parsed)
        if names is not None and parsed.inputs is None:
            opts[PINNED] = json.dumps(names)  # the run reads these, whatever appears meanwhile
        inputs = parsed.inputs
        if job.components is not None:
            opts[COMPONENTS] = job.components
        components = load_components(job.components)
        operators = tuple(components.operator(op, self.root) for op in job.operators)
        if job.late_output is not None and (
            parsed.watermark is None or not parsed.watermark.column
        ):
            raise ConfigError(
                "late_output",
                job.late_output,
                "a pipeline with an event-time watermark (WatermarkStrategy."
                "for_bounded_out_of_orderness(column, bound)): only it has late rows",
            )
        if parsed.watermark is None:  # before anything runs
            needs = {op.uid: why for op in job.all_operators if (why := time_needed(op))}
            if needs:
                reasons = "; ".join(f"operator {uid!r} {why}" for uid, why in needs.items())
                raise ConfigError(
                    "watermark",
                    None,
                    f"a WatermarkStrategy: {reasons}, which needs a pipeline that keeps time "
                    "(WatermarkStrategy.for_bounded_out_of_orderness(column, bound), or "
                    "WatermarkStrategy.no_watermarks() for processing time only)",
                )
        stages = self._placed_stages(job, components)
        partitions = int(self.spark.conf.get("spark.sql.shuffle.partitions") or 200)
        spec = AlignerSpec(
            root=self.root,
            pipeline=self.name,
            run_id=run_id,
            operators=operators,
            channels=channels,
            output=job.output,
            parallelism=job.parallelism,
            mode=alignment_mode(self.config),
            max_parallelism=self._max_parallelism(job),
            pipelined=job.pipelined,
            tracer=job.tracer,
            components=job.components,
            watermark=parsed.watermark,
            late_output=job.late_output,
            storage=self.storage,
            inputs=inputs,
            side_outputs=job.side_outputs,
            stages=stages,
            stage_output=job.stages[0].output if stages else None,
            partitions=partitions,
            state_backend=self.config.state_backend_spec,
        )
        function: RunFunction
        settings: dict[str, str] = {}
        if job.placement is Placement.EXECUTORS:
            ship_by_value([*job.all_operators, job.tracer])  # the job's own code, to executors
            function = SubtaskFunction(spec)
            # the source's read() hands the rows on routed to the subtasks
            key = chain_key(job.operators) if inputs is None else INPUT_KEY
            router = Router(
                key,
                job.parallelism,
                spec.max_parallelism,
                partitions,
                None if parsed.watermark is None else parsed.watermark.column,
            )
            if job.transform is None:  # read() routes; else the transformed rows are routed
                opts.update(router.options())
            if stages:
                settings.update(STAGES_SETTINGS)
        else:
            function = ForeachBatchFunction(spec)
        roles = spec.roles()
        _check_stage_times(roles, parsed.watermark)
        sink = SinkSpec("delta", job.output, roles[-1].vertex)
        late = None if job.late_output is None else SinkSpec("delta", job.late_output, CHAIN_VERTEX)
        sides = tuple(
            (n, SinkSpec("delta", p, role.vertex)) for role in roles for n, p in role.side_outputs
        )
        sides += tuple(
            (stage_output_name(role.vertex), SinkSpec("delta", role.output, role.vertex))
            for role in roles[:-1]
            if role.output is not None
        )
        topology = Topology(
            CHAIN_VERTEX,
            job.parallelism,
            sink,
            run_id,
            late,
            sides,
            tuple((role.vertex, role.parallelism) for role in roles[1:]),
            tuple(
                (role.vertex, stage.name or "")
                for role, stage in zip(roles, job.stages, strict=False)
                if len(roles) > 1
            ),
        )
        self._ensure_side_tables(job)
        write_topology(self.root, topology, run_id)
        mark_starting(self.root, run_id)  # live for requests until its coordinator beats
        self._run_ids.add(run_id)
        df = self.spark.readStream.format("ckpt-source").options(**opts).load()
        if isinstance(job.transform, Mapping) and inputs is not None:
            keys = {spec.name: spec.key_column for spec in inputs.inputs}
            times = {spec.name: spec.time_column for spec in inputs.inputs}
            df = apply_input_transforms(job.transform, df, inputs, keys, times)
        elif job.transform is not None:
            df = apply_transform(job.transform, df, chain_key(job.operators))  # type: ignore[arg-type]
        if inputs is not None:  # each input's columns (transformed), before it runs
            self._check_inputs(job, inputs, operators, parsed, df)
        if parsed.watermark is not None:  # before the query starts: the rows' schema
            rows = user_schema(parsed) if job.transform is None else arrow_schema(df.schema)
            parsed.watermark.check_schema(rows)
            if job.late_output is not None:  # its commits then record every checkpoint
                columns = pa.schema([f for f in rows if f.name not in BARRIER_COLUMNS])
                if inputs is not None:
                    columns = inputs.late_schema(columns)
                target = DeltaSinkTarget(job.late_output, pipeline=self.name)
                DeltaSinkCommitter(target).ensure_table(columns)
        if job.transform is not None and job.placement is Placement.EXECUTORS:
            df = df.mapInArrow(RouteBatches(router), ROUTED_DDL)
            settings.update(ROUTING_SETTINGS)
        return PreparedRun(run_id, df, function, RunFiles(self.root, run_id), settings)

    def _check_inputs(
        self,
        job: JobSpec,
        inputs: Inputs,
        operators: tuple[KeyedOperator, ...],
        parsed: SourceOptions,
        df: DataFrame,
    ) -> None:
        """Each input's own columns, as its transform leaves them: each input's strategy
        checked on them, the first operator bound to them (an operator over several inputs)
        or checked to read inputs of one schema (their union). Raises :class:`ConfigError`."""
        schemas = {}
        for name, inner in zip(inputs.names, parsed.input_options, strict=True):
            if isinstance(job.transform, Mapping) and name in job.transform:
                struct = df.schema[name].dataType
                schemas[name] = arrow_schema(struct)
            else:
                schemas[name] = user_schema(inner)
        for name, strategy in job.input_watermarks:
            if strategy is not None:
                strategy.check_schema(schemas[name])
        bind = getattr(operators[0], "bind_inputs", None)
        if bind is not None:  # the inputs' own columns, known before any row
            bind(schemas)
        if not isinstance(operators[0], KeyedCoOperator) and not same_schemas(
            list(schemas.values())
        ):
            raise ConfigError(
                "sources",
                {n: s.names for n, s in schemas.items()},
                f"inputs of one schema for operator {operators[0].uid!r}, which reads their "
                "union (or an operator over several inputs: KeyedCoOperator)",
            )

    def _max_parallelism(self, job: JobSpec) -> int:
        """The first stage's max parallelism: its Stage's, or the configuration's."""
        own = job.stages[0].max_parallelism if job.stages else None
        return own or self.config.max_parallelism

    def _placed_stages(self, job: JobSpec, components: Components) -> tuple[Stage, ...]:
        """The job's stages after the first, as its run runs them: their operators through the
        components' hook, parallelism and max parallelism decided."""
        placed = []
        for position, stage in enumerate(job.stages[1:], start=1):
            ops = tuple(components.operator(op, self.root) for op in stage.operators)
            own = Stage(
                ops,
                name=stage.name,
                parallelism=stage.parallelism,
                max_parallelism=stage.max_parallelism,
                output=stage.output,
                event_time=stage.event_time,
            )
            placed.append(
                own.placed(position, job.parallelism, self.config.max_parallelism, stage.output)
            )
        return tuple(placed)

    def start(
        self,
        source: Source | None = None,
        operators: Operators = (),
        *,
        output: str,
        available_now: bool = False,
        trigger_s: float | None = None,
        restore: RestoreSettings | None = None,
        **options: Unpack[JobOptions],
    ) -> PipelineRun:
        """Start one run of the job (see :class:`~spark_ckpt.pipeline.job.JobSpec`). The run
        restores from the latest completed checkpoint whose data verifies (chosen by its coordinator
        when the query starts). A failed run is not restarted: :meth:`run` does that. A stop request
        (:meth:`PipelineClient.stop <spark_ckpt.client.pipeline_client.PipelineClient.stop>`,
        ``spark-ckpt stop``) ends the run as under :meth:`run`, carried out by a thread of this
        process (:meth:`PipelineRun.watch_stop_requests
        <spark_ckpt.pipeline.pipeline_run.PipelineRun.watch_stop_requests>`). *available_now*:
        process what is available, then end with a final checkpoint; *trigger_s*: a processing-time
        trigger interval (default: as fast as possible); *tracer*: see :meth:`prepare`; *restore*:
        where to restore from (default: the latest completed checkpoint), see :meth:`restore`."""
        job = JobSpec.of(source, operators, output=output, **options)
        self._check_locations(job)
        self._restore(job, restore)
        run = self._start(job, available_now, trigger_s, attempt=1)
        run.watch_stop_requests()  # PipelineClient.stop (this or any process) ends the run
        return run

    def shape(self, job: JobSpec) -> PipelineShape:
        """What a restore of *job* is checked against (uids, channels, max parallelism). A
        source that names its channels (Kafka partitions) resumes them by name, whatever
        their number: its channel count is not checked."""
        if job.inputs:  # named inputs resume their channels by name: nothing to count
            return PipelineShape(
                pipeline=self.name,
                operator_uids=tuple(op.uid for op in job.all_operators),
                channels={},
                max_parallelism=self.config.max_parallelism,
                inputs=job.input_names,
                operator_max_parallelism=_stage_max_parallelism(job),
            )
        channels, names = _channels(SourceOptions.parse(self.source_options(**job.source)))
        return PipelineShape(
            pipeline=self.name,
            operator_uids=tuple(op.uid for op in job.all_operators),
            channels={} if names is not None else {SOURCE_TASK.vertex: channels},
            max_parallelism=self.config.max_parallelism,
            operator_max_parallelism=_stage_max_parallelism(job),
        )

    def _check_locations(self, job: JobSpec) -> None:
        """Before anything runs: the outputs writable (and committed to safely), a Delta or
        files source readable; else one :class:`~spark_ckpt.errors.StoreError` line naming
        the location (:mod:`spark_ckpt.locations.preflight`)."""
        self._cover(job)
        for output in (job.output, job.late_output, *(p for _, p in job.side_outputs)):
            if output is not None:
                check_commit_safety(output)
                check_writable(output)
        for lookup in job.all_operators:
            if isinstance(lookup, LookupJoin):
                lookup.check_table()
        parsed = SourceOptions.parse(self._job_source_options(job, count=False))  # paths only
        for each in parsed.input_options or (parsed,):
            for options in (each.delta, each.files):
                if options.get("path"):
                    check_readable(options["path"])

    def _job_source_options(self, job: JobSpec, *, count: bool = True) -> dict[str, str]:
        """The ``ckpt-source`` options of *job*'s source: its own, or (named inputs) those of
        ``source=inputs``, each input's channels counted now (*count*; Kafka partitions
        pinned by name), keys and event-time columns taken from the first operator and the
        inputs' strategies, the per-channel bounds and idleness in the watermark options."""
        if not job.inputs:
            return self.source_options(**job.source)
        from spark_ckpt.sources.inputs import INPUT_TIME
        from spark_ckpt.spark.datasource.source_options import INPUTS, INPUTS_KIND

        first = job.operators[0]
        items: list[dict[str, object]] = []
        per_channel: list[tuple[int, int | None]] = []
        strategies = dict(job.input_watermarks)
        for name, source in job.inputs:
            own = {k: str(v) for k, v in source.items()}
            channels = 0
            if count:
                inner = SourceOptions.parse(self.source_options(**own))
                channels, names = _channels(inner)
                if names is not None:
                    own[PINNED] = json.dumps(names)
            key = (
                first.keys[name] if isinstance(first, KeyedCoOperator) else chain_key(job.operators)
            )
            strategy = strategies.get(name)
            items.append(
                {
                    "name": name,
                    "channels": channels,
                    "key": key,
                    "time": None if strategy is None else strategy.column,
                    "options": own,
                    "transformed": isinstance(job.transform, Mapping) and name in job.transform,
                }
            )
            if strategy is not None:
                per_channel += [(strategy.out_of_orderness_ms, strategy.idleness_ms)] * channels
        opts = self.source_options(source=INPUTS_KIND)
        opts[INPUTS] = json.dumps(items)
        given = [s for s in strategies.values() if s is not None]
        if given:
            combined = WatermarkStrategy(
                INPUT_TIME if given[0].event_time else None,
                allowed_lateness_ms=given[0].allowed_lateness_ms,
                channels=tuple(per_channel),
            )
            opts.update(combined.to_options())
        return opts

    def _ensure_side_tables(self, job: JobSpec) -> None:
        """Each named output's table, created with the schema its operator declares, so that
        its commits record every checkpoint, rows or none."""
        schemas = {n: s for op in job.all_operators for n, s in op.side_outputs.items()}
        for name, path in job.side_outputs:
            target = DeltaSinkTarget(path, pipeline=self.name)
            DeltaSinkCommitter(target).ensure_table(schemas[name])

    def _cover(self, job: JobSpec) -> None:
        """Extend the explicit storage options to the buckets of *job*'s outputs and
        source, and install them here."""
        if self.storage:
            parsed = SourceOptions.parse(self._job_source_options(job, count=False))
            self.storage = self.storage.covering(
                job.output,
                job.late_output,
                *(p for _, p in job.side_outputs),
                *_lookup_tables(job),
                *parsed.storage.buckets,
            )
            self.storage.install()

    def _restore(
        self, job: JobSpec, settings: RestoreSettings | None
    ) -> CompletedCheckpoint | None:
        """Before the first run: resolve, check and install the restore point (see
        :mod:`spark_ckpt.pipeline.restore_point`). Raises
        :class:`~spark_ckpt.errors.RestoreError`."""
        from spark_ckpt.delta.sink_committer import DeltaSinkCommitter
        from spark_ckpt.delta.sink_target import DeltaSinkTarget

        if self.storage and settings is not None and settings.path:
            self.storage = self.storage.covering(settings.path)  # a savepoint, another root
            self.storage.install()

        output = DeltaSinkCommitter(DeltaSinkTarget(job.output, pipeline=self.name))
        return prepare_restore(
            self.store,
            self.shape(job),
            settings or RestoreSettings.latest(),
            check_output=output.rollback.check_output_restorable,
        )

    def _start(
        self, job: JobSpec, available_now: bool, trigger_s: float | None, attempt: int
    ) -> PipelineRun:
        prepared = self._prepare(job)
        location = self.spark_checkpoint_location()
        writer = prepared.stream_writer().option("checkpointLocation", location)
        if available_now:
            writer = writer.trigger(availableNow=True)
        elif trigger_s is not None:
            writer = writer.trigger(processingTime=f"{trigger_s} seconds")
        query = prepared.start(writer.queryName(f"{self.name}-{prepared.run_id[:6]}"))
        scratch = location if is_remote(self.root) else None
        run = PipelineRun(
            self, prepared.run_id, attempt, query, prepared.function, prepared.files, scratch
        )
        run.report(RunState.RUNNING)
        return run

    def spark_checkpoint_location(self) -> str:
        """A fresh directory for Spark's own checkpoint of a new run's query (spark-ckpt's
        store is the truth every run restores from, so Spark's checkpoint serves one run
        only). Under a local root: ``<root>/_spark/<uuid>``, kept for inspection. Under an
        object-store root: a local directory of the driver,
        ``<tempdir>/spark-ckpt/<name>-<hash of the root>/<uuid>``, so Spark needs no Hadoop
        connector for the store; it is removed when the run retires."""
        if not is_remote(self.root):
            return os.path.join(self.root, "_spark", uuid.uuid4().hex)
        digest = hashlib.sha256(self.root.encode()).hexdigest()[:12]
        base = os.path.join(tempfile.gettempdir(), "spark-ckpt", f"{self.name}-{digest}")
        return os.path.join(base, uuid.uuid4().hex)

    # -- running ----------------------------------------------------------------------------
    def run(
        self,
        source: Source | None = None,
        operators: Operators = (),
        *,
        output: str,
        available_now: bool = False,
        trigger_s: float | None = None,
        duration_s: float | None = None,
        on_checkpoint: Callable[[CompletedCheckpoint], None] | None = None,
        poll_s: float = 0.5,
        restore: RestoreSettings | None = None,
        on_stop: Callable[[StopReason], None] | None = None,
        **options: Unpack[JobOptions],
    ) -> RunResult:
        """Run the job (see :meth:`start` and :meth:`prepare` for its arguments) until the
        query finishes (``available_now``), *duration_s* passes, Ctrl-C, or a stop request (CLI
        ``spark-ckpt stop``, :meth:`PipelineClient.stop
        <spark_ckpt.client.pipeline_client.PipelineClient.stop>`) — the last three stop with a final
        checkpoint. *on_checkpoint* is called once with each completed checkpoint that
        retention still keeps when the driver polls (every *poll_s*; one subsumed before that
        is counted in the result and in the statistics history, not handed over);
        *on_stop* when a stop on the caller's behalf begins, before its final checkpoint: at
        once on Ctrl-C (on a thread of its own), or when *duration_s* passed. A failed
        run is followed by a new run, restoring from the latest completed checkpoint, as the
        restart strategy allows; beyond it :class:`~spark_ckpt.errors.PipelineFailedError`
        carrying the strategy's reason and the last failure. A pipeline taken over by
        another driver raises :class:`~spark_ckpt.errors.PipelineFencedError` at once (no
        restart). *restore*: where the first run restores from (default: the latest
        completed checkpoint; a savepoint, a checkpoint by id or as of a time, see
        :class:`~spark_ckpt.runtime.restore_settings.RestoreSettings`), checked against the
        job before anything starts (:class:`~spark_ckpt.errors.RestoreError`); restarts
        restore the latest checkpoint of the new lineage."""
        job = JobSpec.of(source, operators, output=output, **options)
        self._check_locations(job)
        start_from = self._restore(job, restore)

        def start(attempt: int) -> PipelineRun:
            return self._start(job, available_now, trigger_s, attempt)

        supervisor = RunSupervisor(
            self,
            start,
            duration_s=duration_s,
            on_checkpoint=on_checkpoint,
            on_stop=on_stop,
            poll_s=poll_s,
            start_from=start_from,
        )
        with Interrupts(supervisor.on_interrupt) as interrupts:
            return supervisor.run(interrupts.requested)


def _check_stage_times(roles: Sequence[StageRole], pipeline: WatermarkStrategy | None) -> None:
    """:class:`ConfigError` for a later stage whose operators read event time from the rows
    by default (windows without a ``time_column``) while the stage names no event-time
    column its rows keep (``Stage(event_time=...)``; by default the pipeline's, or the one the
    inputs name alike)."""
    if pipeline is None or not pipeline.event_time:
        return
    for role in roles[1:]:
        if role.watermark is not None and role.watermark.column is not None:
            continue
        for op in role.operators:
            if hasattr(op, "time_column") and op.time_column is None:
                name = role.vertex.removeprefix(STAGE_PREFIX)
                raise ConfigError(
                    f"Stage({name!r}).event_time",
                    None,
                    f"the event-time column of the stage's rows, which operator {op.uid!r} "
                    "reads (the inputs name theirs differently, so no default), or the "
                    "operator's own time_column",
                )


def _stage_max_parallelism(job: JobSpec) -> tuple[tuple[str, int], ...]:
    """Per operator of a stage with a max parallelism of its own, that max parallelism."""
    return tuple(
        (op.uid, stage.max_parallelism)
        for stage in job.stages
        if stage.max_parallelism is not None
        for op in stage.operators
    )


def _lookup_tables(job: JobSpec) -> list[str]:
    """The tables of *job*'s lookup joins, in chain order, each once."""
    return list(dict.fromkeys(op.table for op in job.all_operators if isinstance(op, LookupJoin)))


def arrow_schema(struct: Any) -> pa.Schema:
    """A Spark ``StructType`` as the Arrow schema its rows arrive in."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(struct, timezone="UTC")


def _channels(options: SourceOptions) -> tuple[int, list[str] | None]:
    """The number of channels of the source the options name and, for a source that names
    them (Kafka partitions, discovered now), their names."""
    source = open_channel_source(options)
    try:
        names: list[str] | None = getattr(source, "channel_names", None)
        return source.channels, None if names is None else list(names)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()
