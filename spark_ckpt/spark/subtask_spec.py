"""What a run's subtasks are built from, in whichever process runs them: a frozen, picklable
description of the job (never a live object with threads, locks, open files or restored
state), shared by both placements — the executors' subtask function
(:mod:`spark_ckpt.spark.executors.subtask_function`) and the driver's foreachBatch function
(:mod:`spark_ckpt.spark.driver.foreach_batch`)."""

from __future__ import annotations

from dataclasses import dataclass

from spark_ckpt.locations.credentials import NO_STORAGE_OPTIONS, StorageOptions
from spark_ckpt.protocol.trace import NOOP_TRACER, Tracer
from spark_ckpt.runtime.aligner import AlignmentMode
from spark_ckpt.runtime.components import load_components
from spark_ckpt.runtime.event_time import WatermarkStrategy
from spark_ckpt.runtime.operator import KeyedOperator
from spark_ckpt.runtime.stage import FIRST_STAGE_VERTEX, Stage
from spark_ckpt.runtime.stage_output import forwarded_strategy
from spark_ckpt.sinks.two_phase_commit import TransactionalSink
from spark_ckpt.sources.inputs import Inputs, common_time
from spark_ckpt.state.backends.spec import HASHMAP, StateBackendSpec
from spark_ckpt.storage.checkpoint_store import WorkerStorage


@dataclass(frozen=True)
class AlignerSpec:
    """Everything a run's subtasks are built from (picklable): the foreachBatch aligner's,
    or (on the executors) :class:`~spark_ckpt.spark.executors.subtask_function.SubtaskFunction`'s.
    *tracer* receives the subtasks' spans (:mod:`spark_ckpt.protocol.trace`) in the process
    that runs them, on the batch's thread and the snapshot worker's thread; it must be
    picklable and cheap. Default: no tracing. *components*: ``module:name`` of the job's
    :class:`~spark_ckpt.runtime.components.Components` (the checkpoint store the subtasks
    use passes its ``store`` hook), or None. *watermark*: the pipeline keeps event time;
    *late_output*: the Delta table of the rows dropped as late (None: none). *storage*: the
    pipeline's explicit storage options (:mod:`spark_ckpt.locations.credentials`; empty:
    the environment's)."""

    root: str
    pipeline: str
    run_id: str
    operators: tuple[KeyedOperator, ...]
    channels: int
    output: str
    parallelism: int = 2
    mode: AlignmentMode = AlignmentMode.ALIGNED
    max_parallelism: int = 128
    pipelined: bool = True
    tracer: Tracer = NOOP_TRACER
    components: str | None = None
    watermark: WatermarkStrategy | None = None
    late_output: str | None = None
    #: the pipeline's explicit storage options, installed wherever the subtasks run
    storage: StorageOptions = NO_STORAGE_OPTIONS
    #: several named inputs, in their union form (:mod:`spark_ckpt.sources.inputs`), or None
    inputs: Inputs | None = None
    #: the operators' named outputs and their Delta tables (side outputs)
    side_outputs: tuple[tuple[str, str], ...] = ()
    #: the job's later stages (:mod:`spark_ckpt.runtime.stage`), placed; empty: one stage
    stages: tuple[Stage, ...] = ()
    #: several stages: the first stage's own output table (None: none; *output* is the last
    #: stage's)
    stage_output: str | None = None
    #: the partitions of the subtasks' Spark stages (executors: routes between stages)
    partitions: int = 200
    #: where the subtasks keep their keyed state (``state.backend.type``)
    state_backend: StateBackendSpec = HASHMAP

    def role(self, position: int) -> StageRole:
        """What the subtasks of the stage at *position* (0: the first) are built from."""
        last = position == len(self.stages)
        following = None if last else self.stages[position]
        if position == 0:
            return StageRole(
                position,
                FIRST_STAGE_VERTEX,
                self.operators,
                self.parallelism,
                self.max_parallelism,
                self.channels,
                self.output if last else self.stage_output,
                self.watermark,
                self.inputs,
                self.late_output,
                _declared(self.side_outputs, self.operators),
                following,
            )
        stage = self.stages[position - 1]
        upstream = self.role(position - 1)
        assert stage.parallelism is not None and stage.max_parallelism is not None
        return StageRole(
            position,
            stage.vertex,
            stage.operators,
            stage.parallelism,
            stage.max_parallelism,
            upstream.parallelism,
            self.output if last else stage.output,
            forwarded_strategy(self.watermark, stage.event_time or self._time_column()),
            None,
            None,
            _declared(self.side_outputs, stage.operators),
            following,
        )

    def _time_column(self) -> str | None:
        """The event-time column a later stage's rows keep by default: the pipeline's, or with
        several inputs, the one every input names alike (their union form's own column is
        not in any stage's output)."""
        if self.inputs is not None:
            return common_time(self.inputs)
        return None if self.watermark is None else self.watermark.column

    def roles(self) -> tuple[StageRole, ...]:
        """Every stage's role, in order."""
        return tuple(self.role(p) for p in range(len(self.stages) + 1))

    def store(self) -> WorkerStorage:
        """The checkpoint store of the subtasks, in the calling process."""
        from spark_ckpt.delta.delta_store import DeltaCheckpointStore

        components = load_components(self.components)
        return components.store(DeltaCheckpointStore(self.root), self.root)


def _declared(
    outputs: tuple[tuple[str, str], ...], operators: tuple[KeyedOperator, ...]
) -> tuple[tuple[str, str], ...]:
    """The named outputs of *outputs* that one of *operators* declares."""
    names = {n for op in operators for n in op.side_outputs}
    return tuple((n, p) for n, p in outputs if n in names)


@dataclass(frozen=True)
class StageRole:
    """The subtasks of one stage of a run (:meth:`AlignerSpec.role`): at *position*, of
    *vertex*, running *operators* on *parallelism* subtasks over *max_parallelism* key groups
    and *channels* input channels (the source's, or the upstream stage's subtasks), into the
    Delta table *output* (None: none of their own), keeping time under *watermark*; the first
    stage also reads the *inputs*, and writes rows dropped as late to *late_output*. *following*:
    the next stage, which the subtasks forward their output to (None: the last)."""

    position: int
    vertex: str
    operators: tuple[KeyedOperator, ...]
    parallelism: int
    max_parallelism: int
    channels: int
    output: str | None
    watermark: WatermarkStrategy | None
    inputs: Inputs | None
    late_output: str | None
    side_outputs: tuple[tuple[str, str], ...]
    following: Stage | None

    def sinks(
        self, pipeline: str
    ) -> tuple[TransactionalSink | None, TransactionalSink | None, dict[str, TransactionalSink]]:
        """The stage's output sink, late-row sink and named outputs' sinks, in the calling
        process."""
        from spark_ckpt.delta.delta_sink import DeltaSink

        sink = None if self.output is None else DeltaSink(self.output, pipeline=pipeline)
        late = None if self.late_output is None else DeltaSink(self.late_output, pipeline=pipeline)
        sides: dict[str, TransactionalSink] = {
            name: DeltaSink(path, pipeline=pipeline) for name, path in self.side_outputs
        }
        return sink, late, sides
