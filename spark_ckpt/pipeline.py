"""The user-facing API: a checkpointed streaming pipeline on Spark.

.. code-block:: python

    from spark_ckpt.pipeline import Pipeline
    from spark_ckpt.operator import RunningCount

    pipeline = Pipeline(spark, "orders", config=CheckpointConfig(interval_ms=1000))
    events = pipeline.read(source="generator", channels=4, rate=10_000)
    counts = pipeline.aligner(RunningCount("counter", "user_id"), output="/lake/counts")
    pipeline.run(lambda: pipeline.start(events, counts), duration_s=60)

    # stateless, straight into Delta with two-phase commit:
    events.writeStream.format("ckpt-sink").option("pipeline", "orders") \\
        .option("path", "/lake/orders_out").start()

Everything of a pipeline lives under one root (default ``./spark-ckpt-data/<name>``): the Delta
checkpoint store, the coordinator's mailbox, the topology, and the Spark checkpoint locations
of its query runs. Each run gets a fresh Spark checkpoint location: the truth is the
spark-ckpt checkpoint store, from which every run restores (rewinding the source channels to
their barrier positions), as a Flink job restores from its latest checkpoint.

Runs in the user's driver process. Imports pyspark lazily.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .aligner import AlignmentMode
from .batch_aligner import BatchAligner
from .checkpoint import CompletedCheckpoint
from .clock import SystemClock
from .config import CheckpointConfig, CheckpointingMode
from .errors import CheckpointError, PipelineFailedError, SparkCkptError
from .host import REQUEST_ID
from .mailbox import Mailbox, Request, RequestKind, SinkSpec
from .operator import KeyedOperator
from .restart import RestartTracker
from .source_options import SourceOptions, default_root

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from .delta_store import DeltaCheckpointStore

log = logging.getLogger(__name__)


def register_data_sources(spark: SparkSession) -> None:
    """Register ``ckpt-source`` and ``ckpt-sink`` explicitly (auto-registration needs the
    ``pyspark_*`` shims on the workers' path; this works everywhere)."""
    from datasources.sink import CkptSink
    from datasources.source import CkptSource

    spark.dataSource.register(CkptSource)
    spark.dataSource.register(CkptSink)


def alignment_mode(config: CheckpointConfig) -> tuple[AlignmentMode, int]:
    """The aligner mode and aligned-checkpoint timeout that implement *config*."""
    if config.mode is CheckpointingMode.AT_LEAST_ONCE:
        return AlignmentMode.AT_LEAST_ONCE, 0
    if config.unaligned and config.aligned_checkpoint_timeout_ms > 0:
        return AlignmentMode.ALIGNED, config.aligned_checkpoint_timeout_ms
    if config.unaligned:
        return AlignmentMode.UNALIGNED, 0
    return AlignmentMode.ALIGNED, 0


@dataclass(frozen=True)
class RunResult:
    restarts: int
    last_checkpoint: CompletedCheckpoint | None
    stopped_by: str  # "finished" | "duration" | "interrupt" | "stop"


class Pipeline:
    """One checkpointed pipeline: a name, a root, a checkpoint configuration."""

    def __init__(
        self,
        spark: SparkSession,
        name: str,
        *,
        config: CheckpointConfig | None = None,
        root: str | None = None,
    ) -> None:
        self.spark = spark
        self.name = name
        self.config = config or CheckpointConfig(interval_ms=1000)
        self.root = (
            os.path.abspath(root) if root and "://" not in root else (root or default_root(name))
        )
        self.mailbox = Mailbox(self.root)
        self._store: DeltaCheckpointStore | None = None
        self._source: SourceOptions | None = None
        self._aligner: BatchAligner | None = None  # the latest aligner(): drained by stop()
        register_data_sources(spark)

    @property
    def store(self) -> DeltaCheckpointStore:
        if self._store is None:
            from .delta_store import DeltaCheckpointStore

            self._store = DeltaCheckpointStore(self.root)
        return self._store

    # -- building ---------------------------------------------------------------------------
    def source_options(self, **options: object) -> dict[str, str]:
        opts = {k: str(v) for k, v in options.items()}
        opts.update(self.config.to_options())
        opts.update(pipeline=self.name, store=self.root)
        return opts

    def read(self, **options: object) -> DataFrame:
        """``spark.readStream.format("ckpt-source")`` for this pipeline; options are validated
        here, raising :class:`~spark_ckpt.errors.ConfigError` naming a bad option."""
        opts = self.source_options(**options)
        self._source = SourceOptions.parse(opts)
        return self.spark.readStream.format("ckpt-source").options(**opts).load()

    def channels(self) -> int:
        if self._source is None:
            raise SparkCkptError("call read() before building the consumer")
        from datasources.source import open_channel_source

        return open_channel_source(self._source).channels

    def aligner(
        self,
        operators: KeyedOperator | Sequence[KeyedOperator],
        *,
        output: str,
        parallelism: int = 2,
        vertex: str | None = None,
        pipelined: bool = True,
    ) -> BatchAligner:
        """The foreachBatch aligner running *operators* (keyed state, aligned as configured),
        writing their output exactly-once into the Delta table *output*. *pipelined*: process
        a micro-batch while Spark reads the next (see :class:`BatchAligner`); ``False``
        processes each batch inside its ``foreachBatch`` call."""
        from .delta_sink import DeltaSink
        from .delta_store import DeltaCheckpointStore

        self._retire_aligner()
        ops = [operators] if isinstance(operators, KeyedOperator) else list(operators)
        vertex = vertex or ops[0].uid
        mode, timeout = alignment_mode(self.config)
        out = os.path.abspath(output) if "://" not in output else output
        aligner = BatchAligner(
            self.root,
            DeltaCheckpointStore(self.root),  # its own: the aligner's worker thread uses it
            operators=ops,
            channels=self.channels(),
            parallelism=parallelism,
            mode=mode,
            aligned_timeout_ms=timeout,
            max_parallelism=self.config.max_parallelism,
            sink=DeltaSink(out, pipeline=self.name, sink_uid=vertex),
            sink_spec=SinkSpec("delta", out, vertex),
            vertex=vertex,
            async_snapshots=True,
            pipelined=pipelined,
        )
        self._aligner = aligner
        return aligner

    def start(
        self,
        df: DataFrame,
        aligner: BatchAligner,
        *,
        available_now: bool = False,
        trigger_s: float | None = None,
    ) -> StreamingQuery:
        """Start *df* through *aligner* with a fresh Spark checkpoint location."""
        writer = df.writeStream.foreachBatch(aligner).option(
            "checkpointLocation", self.spark_checkpoint_location()
        )
        if available_now:
            writer = writer.trigger(availableNow=True)
        elif trigger_s is not None:
            writer = writer.trigger(processingTime=f"{trigger_s} seconds")
        return writer.queryName(f"{self.name}-{uuid.uuid4().hex[:6]}").start()

    def spark_checkpoint_location(self) -> str:
        return os.path.join(self.root, "_spark", uuid.uuid4().hex)

    # -- running ------------------------------------------------------------------------------
    def run(
        self,
        start_query: Callable[[], StreamingQuery],
        *,
        duration_s: float | None = None,
        on_checkpoint: Callable[[CompletedCheckpoint], None] | None = None,
        poll_s: float = 0.5,
    ) -> RunResult:
        """Run until the query finishes, *duration_s* passes, or Ctrl-C — the last two stop
        with a final checkpoint. A failed query is restarted (restoring from the latest
        checkpoint) as the restart strategy allows; beyond it :class:`PipelineFailedError`."""
        from pyspark.errors import StreamingQueryException

        tracker = RestartTracker(self.config.restart_strategy, SystemClock())
        deadline = None if duration_s is None else time.monotonic() + duration_s
        seen = max((c.checkpoint_id for c in self.store.list_completed()), default=0)
        restarts = 0
        while True:
            query = start_query()
            try:
                while query.isActive:
                    query.awaitTermination(poll_s)  # type: ignore[arg-type]  # float seconds work
                    seen = self._report(seen, on_checkpoint)
                    if deadline is not None and time.monotonic() >= deadline:
                        last = self.stop(query)
                        return RunResult(restarts, last, "duration")
                query.awaitTermination()  # raises if it failed
                self._drain_aligner()
                seen = self._report(seen, on_checkpoint)
                return RunResult(restarts, self.store.latest_completed(), "finished")
            except KeyboardInterrupt:
                last = self.stop(query)
                return RunResult(restarts, last, "interrupt")
            except StreamingQueryException as e:
                decision = tracker.record_failure(str(e).splitlines()[0] if str(e) else repr(e))
                if not decision.restart:
                    raise PipelineFailedError(f"{decision.reason}\n{e}") from e
                restarts += 1
                log.warning(
                    "query failed; restart %d in %d ms: %s",
                    restarts,
                    decision.delay_ms,
                    decision.reason,
                )
                time.sleep(decision.delay_ms / 1000)

    def _report(
        self, seen: int, on_checkpoint: Callable[[CompletedCheckpoint], None] | None
    ) -> int:
        for cp in self.store.list_completed():
            if cp.checkpoint_id > seen:
                seen = cp.checkpoint_id
                if on_checkpoint is not None:
                    on_checkpoint(cp)
        return seen

    # -- requests (from a notebook, the CLI, or run()) ------------------------------------
    def request(self, kind: RequestKind, target: str | None = None, savepoint: bool = False) -> str:
        request_id = uuid.uuid4().hex
        self.mailbox.post(Request(request_id, kind, target, savepoint))
        return request_id

    def wait_for(self, request_id: str, timeout_s: float = 120.0) -> CompletedCheckpoint:
        """Wait until the checkpoint answering *request_id* completed (and its output is
        committed). Raises :class:`CheckpointError` on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for cp in self.store.list_completed():
                if cp.properties.get(REQUEST_ID) == request_id:
                    return cp
            time.sleep(0.2)
        raise CheckpointError(f"no checkpoint answered request {request_id} within {timeout_s} s")

    def checkpoint(self, timeout_s: float = 120.0) -> CompletedCheckpoint:
        return self.wait_for(self.request(RequestKind.CHECKPOINT), timeout_s)

    def savepoint(self, target: str | None = None, timeout_s: float = 120.0) -> CompletedCheckpoint:
        return self.wait_for(self.request(RequestKind.SAVEPOINT, target), timeout_s)

    def stop(
        self, query: StreamingQuery, *, savepoint: bool = False, timeout_s: float = 120.0
    ) -> CompletedCheckpoint | None:
        """Stop with a final checkpoint (or savepoint): request it, wait until it completed,
        then stop the query. Returns it (None if the query was no longer running)."""
        if not query.isActive:
            return self.store.latest_completed()
        final = self.wait_for(self.request(RequestKind.STOP, savepoint=savepoint), timeout_s)
        self._wait_committed(final)
        query.stop()
        self._drain_aligner()
        return final

    def _retire_aligner(self) -> None:
        """Before a new aligner restores state (a restart within this process): end the
        previous one, dropping a batch still in flight — the new run restores the latest
        completed checkpoint and reads it again — so no old thread writes after the restore."""
        old, self._aligner = self._aligner, None
        if old is None:
            return
        old.abandon()
        try:
            old.close()
        except Exception as e:  # the failure that caused the restart, already reported
            log.debug("retired aligner: %s", e)

    def _drain_aligner(self) -> None:
        """Wait for what the aligner still processes (a pipelined batch, snapshot writes);
        raises what failed it."""
        if self._aligner is not None:
            self._aligner.drain()

    def _wait_committed(self, checkpoint: CompletedCheckpoint, timeout_s: float = 60.0) -> None:
        """The coordinator commits sink output right after completion; wait for it."""
        from .mailbox import read_topology

        topology = read_topology(self.root)
        if topology is None or topology.sink is None:
            return
        from datasources.sink import sink_from_spec

        sink = sink_from_spec(topology.sink, pipeline=self.name)
        deadline = time.monotonic() + timeout_s
        while sink.committed_checkpoint() < checkpoint.checkpoint_id:
            if time.monotonic() > deadline:
                raise CheckpointError(
                    f"output of checkpoint {checkpoint.checkpoint_id} was not committed in time"
                )
            time.sleep(0.2)

    def checkpoints(self) -> list[CompletedCheckpoint]:
        return self.store.list_completed()
