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
from spark_ckpt.sinks.two_phase_commit import TransactionalSink
from spark_ckpt.sources.inputs import Inputs
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

    def side_sinks(self) -> dict[str, TransactionalSink]:
        """The named outputs' sinks, in the calling process."""
        from spark_ckpt.delta.delta_sink import DeltaSink

        return {name: DeltaSink(path, pipeline=self.pipeline) for name, path in self.side_outputs}

    def store(self) -> WorkerStorage:
        """The checkpoint store of the subtasks, in the calling process."""
        from spark_ckpt.delta.delta_store import DeltaCheckpointStore

        components = load_components(self.components)
        return components.store(DeltaCheckpointStore(self.root), self.root)
