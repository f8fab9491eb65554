"""The ``foreachBatch`` function of a run: a picklable spec that builds its runtime lazily.

Spark calls the function given to ``writeStream.foreachBatch`` in the user's driver process
(under Spark Connect: in a server-side Python process, after unpickling it). What crosses that
boundary must therefore be a *description* of the job, never a live object with threads,
locks, open files or restored state:

* :class:`~spark_ckpt.spark.subtask_spec.AlignerSpec` — frozen: the run id, the operators (plain
  picklable objects; their state lives in the state backend, not in them), the channel count, the
  parallelism, the alignment mode, the output table, the tracer (:mod:`spark_ckpt.protocol.trace`;
  it must be picklable too);
* :class:`ForeachBatchFunction` — holds a spec; at its first call in a process it builds the
  :class:`~spark_ckpt.spark.driver.batch_aligner.BatchAligner` (threads, keyed state restored from
  the run's restore point, the Delta sink). Pickling it drops the runtime.

One function serves one run. A new attempt of :meth:`Pipeline.run
<spark_ckpt.pipeline.pipeline.Pipeline.run>` is a new run with a new function, so operator state,
buffered alignment input, pending snapshots, staged output and errors of a failed attempt can
never leak into the next one: each restores from the checkpoint its own coordinator chose
(:meth:`CoordinatorHost.start_run <spark_ckpt.coordination.host.CoordinatorHost.start_run>`).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pyarrow as pa

from spark_ckpt.coordination.runs import RunFiles
from spark_ckpt.errors import ProtocolError, StateError
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.runtime.task import CHAIN_VERTEX
from spark_ckpt.spark.driver.batch_aligner import BatchAligner, StageSetup, collect_arrow
from spark_ckpt.spark.subtask_spec import AlignerSpec, StageRole
from spark_ckpt.storage.checkpoint_store import WorkerStorage


def build_aligner(spec: AlignerSpec) -> BatchAligner:
    """The runtime, in the calling process: restores from the run's restore point, which
    the run's coordinator published before the first micro-batch (``initialOffset``)."""
    point = RunFiles(spec.root, spec.run_id).restore_point()
    if point is None:
        raise ProtocolError(
            f"run {spec.run_id} has no restore point: its coordinator did not start "
            "(the foreachBatch function must consume this run's ckpt-source)"
        )
    store = spec.store()
    restored = None if point.checkpoint_id is None else store.get(point.checkpoint_id)
    try:
        return _aligner(spec, store, restored)
    except StateError as e:
        # the state does not fit the operators (an incompatible schema change): every
        # restart would fail the same way, so the run tells its driver not to retry
        RunFiles(spec.root, spec.run_id).write_fatal(f"{type(e).__name__}: {e}")
        raise


def _aligner(
    spec: AlignerSpec, store: WorkerStorage, restored: CompletedCheckpoint | None
) -> BatchAligner:
    first, *later = spec.roles()
    sink, late, sides = first.sinks(spec.pipeline)
    return BatchAligner(
        spec.root,
        store,
        operators=spec.operators,
        channels=spec.channels,
        parallelism=spec.parallelism,
        mode=spec.mode,
        max_parallelism=spec.max_parallelism,
        sink=sink,
        vertex=CHAIN_VERTEX,
        async_snapshots=True,
        pipelined=spec.pipelined,
        restore_from=restored,
        run_id=spec.run_id,
        tracer=spec.tracer,
        state_backend=spec.state_backend,
        watermark=spec.watermark,
        inputs=spec.inputs,
        side_sinks=sides,
        late_sink=late,
        later_stages=[_setup(role, spec.pipeline) for role in later],
    )


def _setup(role: StageRole, pipeline: str) -> StageSetup:
    """A later stage's subtasks as the aligner builds them."""
    sink, _, sides = role.sinks(pipeline)
    return StageSetup(
        role.vertex,
        role.operators,
        role.parallelism,
        role.max_parallelism,
        role.channels,
        sink,
        role.watermark,
        side_sinks=sides,
        forward=role.following is not None,
    )


class ForeachBatchFunction:
    """``writeStream.foreachBatch(fn)`` for one run: see the module docstring. Calls run one
    at a time (Spark's micro-batch thread)."""

    def __init__(self, spec: AlignerSpec) -> None:
        self.spec = spec
        self._aligner: BatchAligner | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["spec"])  # type: ignore[misc]

    @property
    def aligner(self) -> BatchAligner | None:
        """The runtime, once built (None before the first micro-batch)."""
        return self._aligner

    def runtime(self) -> BatchAligner:
        with self._lock:
            if self._aligner is None:
                self.spec.storage.install()  # the pipeline's storage options, here
                self._aligner = build_aligner(self.spec)
            return self._aligner

    def __call__(self, df: Any, batch_id: int) -> None:
        """``foreachBatch`` entry point: collect the micro-batch as Arrow and hand it to the
        run's aligner (see :meth:`BatchAligner.submit`)."""
        self.submit(collect_arrow(df))

    def submit(self, table: pa.Table) -> None:
        self.runtime().submit(table)

    def drain(self) -> None:
        """Wait for the batch in flight and the asynchronous snapshot work; raises what failed
        them. A no-op before the first batch."""
        if self._aligner is not None:
            self._aligner.drain()

    def retire(self) -> None:
        """End the run's runtime after its query ended: drop a batch still in flight (the next
        run restores the latest completed checkpoint and reads it again) and end the
        threads. Idempotent; never raises what failed the run (it was reported already)."""
        aligner = self._aligner
        if aligner is None:
            return
        aligner.abandon()
        # what failed the run was reported already (it failed the query)
        with contextlib.suppress(Exception):
            aligner.close()
