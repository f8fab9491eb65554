"""The ``foreachBatch`` function of a benchmark query: :class:`Probe` calls the run's function
(public API only) and records each call — rows, barriers, wall time and the phases the run's
:class:`~pipelinebench.timing.PhaseTimer` measured."""

from __future__ import annotations

import cProfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc

from pipelinebench.timing import PhaseTimer
from spark_ckpt.protocol.barrier import CHANNEL, CHECKPOINT_ID
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.spark.driver.batch_aligner import collect_arrow
from spark_ckpt.spark.driver.foreach_batch import ForeachBatchFunction


@dataclass
class BatchRecord:
    batch_id: int
    start: float  # perf_counter at entry
    end: float  # perf_counter at exit
    wall_end_ms: float  # time.time() at exit, in ms (to compare with checkpoint timestamps)
    data_rows: int
    barriers: list[tuple[int, int]]  # (checkpoint id, channel) of barrier rows in the batch
    phases: dict[str, float]


@dataclass
class Probe:
    """Wraps a run's :class:`ForeachBatchFunction` as the ``foreachBatch`` function and records
    each call. *timer* must be the tracer the run was prepared with.

    ``after_batch(index)`` (optional) runs at the end of the *index*-th call (0-based).
    :attr:`completed` is filled by the query's driver loop
    (:func:`~pipelinebench.query.run_query`), which polls the pipeline's store."""

    function: ForeachBatchFunction
    timer: PhaseTimer
    after_batch: Callable[[int], None] | None = None
    profiler: cProfile.Profile | None = None
    batches: list[BatchRecord] = field(default_factory=list)
    completed: dict[int, CompletedCheckpoint] = field(default_factory=dict)
    error: BaseException | None = None
    data_rows: int = 0
    changed: threading.Event = field(default_factory=threading.Event)

    def __call__(self, df: Any, batch_id: int) -> None:
        try:
            self._call(df, batch_id)
        except BaseException as e:  # recorded for the driver loop, then re-raised to Spark
            self.error = e
            self.changed.set()
            raise

    def _call(self, df: Any, batch_id: int) -> None:
        if self.profiler is not None:
            self.profiler.enable()
        self.timer.owner = threading.get_ident()
        start = time.perf_counter()
        with self.timer.phase("toArrow"):
            table = collect_arrow(df)  # a stop interrupting it ends the query quietly
        with self.timer.phase("aligner_other"):
            self.function.submit(table)  # pipelined: waits for the previous batch, hands off
        end = time.perf_counter()
        if self.profiler is not None:
            self.profiler.disable()
        ids = table.column(CHECKPOINT_ID)
        control = pc.is_valid(ids)
        n_control = pc.sum(control).as_py() or 0
        barriers: list[tuple[int, int]] = []
        if n_control:
            rows = table.filter(control).select([CHECKPOINT_ID, CHANNEL]).to_pylist()
            barriers = [(r[CHECKPOINT_ID], r[CHANNEL]) for r in rows]
        data_rows = table.num_rows - n_control
        self.data_rows += data_rows
        self.batches.append(
            BatchRecord(
                batch_id, start, end, time.time() * 1000, data_rows, barriers, self.timer.reset()
            )
        )
        if self.after_batch is not None:
            self.after_batch(len(self.batches) - 1)
        self.changed.set()
