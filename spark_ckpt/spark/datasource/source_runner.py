"""The work of ``ckpt-source``'s stream reader (:mod:`datasources.ckpt_source` holds its hooks):
rows with the user's columns plus the barrier columns of :mod:`spark_ckpt.protocol.barrier`, one
input partition per channel, rows in channel order, barrier rows between data rows where the
source took a trigger. The offsets Spark logs
(:class:`~spark_ckpt.sources.stream_offset.StreamOffset`) contain the barrier positions, so a
replayed micro-batch re-emits identical barriers.

Where it runs (see ``docs/spark-notes.md``):

* :class:`SourceRunner` — the *source runner*, one long-lived driver-side process per query
  run (``initialOffset``/``latestOffset``/``partitions``/``commit``). The checkpoint
  coordinator lives there (:class:`~spark_ckpt.coordination.host.CoordinatorHost`) on its
  own thread (:class:`~spark_ckpt.coordination.host_thread.HostThread`); ``latestOffset``
  takes the barriers it triggered. ``initialOffset`` (called twice at start; deterministic)
  rewinds every channel to its position in the checkpoint the run restores;
* :func:`read_partition` — executors: reads the planned rows and inserts the barrier rows; on
  the executor path (``route.*`` options, set by the pipeline) it hands them on routed to the
  subtasks, one payload per subtask (:mod:`spark_ckpt.spark.executors.routing`).
"""

from __future__ import annotations

import gc
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from spark_ckpt.coordination.global_committer import sink_from_spec
from spark_ckpt.coordination.host import HOST_RETAIN_EVERY_MS, CoordinatorHost
from spark_ckpt.coordination.host_thread import HostThread, exit_quietly_if_channel_closed
from spark_ckpt.coordination.live_report import channel_progress
from spark_ckpt.errors import CheckpointError, ProtocolError, StoreError
from spark_ckpt.locations.credentials import NO_STORAGE_OPTIONS, StorageOptions
from spark_ckpt.protocol.barrier import ChannelProgress, CheckpointBarrier
from spark_ckpt.protocol.clock import SystemClock
from spark_ckpt.runtime.request_decider import CheckpointRequest, RequestStatus
from spark_ckpt.runtime.task import SOURCE_TASK
from spark_ckpt.sources.channel_batch import channel_rows, stream_schema
from spark_ckpt.sources.channel_source import ChannelSource, ReadPlan, read_rows
from spark_ckpt.sources.stream_offset import StreamOffset
from spark_ckpt.spark.datasource.channel_sources import open_channel_source
from spark_ckpt.spark.datasource.source_options import SourceOptions
from spark_ckpt.spark.executors.routing import Router
from spark_ckpt.spark.executors.snapshot_threads import LostWriterScan

log = logging.getLogger(__name__)


def open_host(options: SourceOptions) -> CoordinatorHost:
    """The coordinator's host of a ``ckpt-source`` query (source runner), handed its helpers:
    the job's checkpoint store and sink committer (:mod:`spark_ckpt.runtime.components`) and,
    for a run of a pipeline, the scan for state writes its executors lost."""
    from spark_ckpt.delta.delta_store import DeltaCheckpointStore

    components = options.components
    return CoordinatorHost(
        options.root,
        options.config,
        components.store(DeltaCheckpointStore(options.root), options.root),
        sink_factory=lambda spec: components.committer(
            sink_from_spec(spec, pipeline=options.pipeline, storage=options.storage),
            options.root,
        ),
        defer_after_completion=True,  # run by a HostThread
        retain_every_ms=HOST_RETAIN_EVERY_MS,
        run_id=options.run_id,
        pipeline=options.pipeline,
        lost_writers=None
        if options.run_id is None
        else LostWriterScan(options.root, options.run_id),
    )


def _freeze_worker_heap() -> None:
    """Executor (Python worker), after a ``read``: move every object alive now — the modules
    this worker imported, mostly — into the garbage collector's permanent generation.

    A reused PySpark worker runs ``gc.collect()`` after every task; with pyarrow, numpy and
    this package imported that full collection walks every long-lived object (O(heap) per
    task, on the critical path of every micro-batch; figures: ``docs/spark-notes.md``,
    section 2). Frozen objects are still freed by reference counting; only cycles among them
    are no longer collected (the same trade-off as CPython's own ``gc.freeze``
    recommendation for pre-fork servers)."""
    gc.freeze()


@dataclass(frozen=True)
class ChannelPartition(InputPartition):  # type: ignore[misc]
    """One channel of one micro-batch: what ``read`` needs, nothing else."""

    channel: int
    start: int
    plan: ReadPlan
    marks: tuple[tuple[int, CheckpointBarrier], ...]
    schema: pa.Schema
    channels: int
    router: Router | None = None  # the executor path: rows leave routed to the subtasks
    progress: ChannelProgress | None = None  # event time: the channel's progress row
    storage: StorageOptions = NO_STORAGE_OPTIONS  # the pipeline's, installed before the read


#: Event time: without new rows, the source still plans a micro-batch (a *tick*, progress
#: only) this often, so that idleness and processing time move on.
TICK_MS = 1000
#: ``Trigger.AvailableNow``: how long the final checkpoint waits for a consumer to appear
#: in the coordinator before the query fails for want of one.
CONSUMER_WAIT_S = 10.0
#: ``Trigger.AvailableNow``: how long past the longest the coordinator may take to decide
#: the final checkpoint (twice its timeout, plus the minimum pause: one pending checkpoint
#: ahead of it, then its own) the source runner waits for a decision before it calls the
#: coordinator stuck. The coordinator's polls expire the checkpoint at its timeout and a
#: failed one is triggered again, so this never shortens a checkpoint's own timeout.
FINAL_DECISION_GRACE_S = 30.0


class SourceRunner:
    """The work of ``ckpt-source``'s stream reader, one per query run (see the module
    docstring): the hooks of :class:`~datasources.ckpt_source.CkptStreamReader` call these
    methods, named after them."""

    def __init__(self, options: SourceOptions, user_schema: pa.Schema) -> None:
        self.options = options
        self.user_schema = user_schema
        self.schema = stream_schema(user_schema)  # of the rows read (before any routing)
        self._source: ChannelSource | None = None
        self._host: HostThread | None = None
        self._target: list[int] | None = None  # Trigger.AvailableNow: read up to here
        self._final: CheckpointRequest | None = None
        self._final_deadline = 0.0  # monotonic: when the final request is overdue
        self._stop_at: tuple[int, ...] | None = None
        self._drain_to: list[int] | None = None  # a stop with drain reads up to here
        self._heads: list[int] | None = None  # the channels' heads at the last latestOffset
        self._starts: Sequence[int] | None = None  # the run's initial positions
        self._clock = SystemClock()  # the aligned-checkpoint timeout (recorded in the offsets)
        self._initial: dict[str, Any] | None = None  # initialOffset's answer
        self._next_discovery = 0.0  # monotonic: when to look for new channels next
        self._restarting = False  # new channels found: the run ends with a final checkpoint
        self._notified = 0  # the last completed checkpoint the source was told of
        self._active_ms: list[int] = []  # event time: per channel, when it last had rows
        self._lookups: dict[str, Any] = {}  # the lookup joins' tables (FollowedTable)

    # -- lazily opened, in the source runner ---------------------------------------------------
    @property
    def source(self) -> ChannelSource:
        if self._source is None:
            self._source = open_channel_source(self.options)
        return self._source

    @property
    def host(self) -> HostThread:
        """The coordinator host, polled on its own thread from the first ``latestOffset``."""
        if self._host is None:
            self._host = HostThread(open_host(self.options))
        return self._host

    # -- offsets -----------------------------------------------------------------------------
    def initial_offset(self) -> dict[str, Any]:
        """Source runner; deterministic (Spark calls it twice: the first answer is kept).
        The positions of the checkpoint the run restores from
        (:meth:`CoordinatorHost.start_run`), by channel index, or by channel name for a
        source that names its channels (Kafka partitions); without a checkpoint, where the
        source starts (``startingOffsets``; the first row otherwise)."""
        if self._initial is None:
            self._initial = self._initial_offset().to_dict()
        return self._initial

    def _initial_offset(self) -> StreamOffset:
        latest = self.host.call(lambda host: host.start_run())
        source = self.source
        names: list[str] | None = getattr(source, "channel_names", None)
        if names is not None:  # every checkpoint of the run records them
            self.host.call(lambda host: host.name_channels(names))
        if latest is None:
            start = getattr(source, "start_positions", None)
            return StreamOffset.initial([0] * source.channels if start is None else start())
        offsets = latest.offsets()
        if names is not None:
            from spark_ckpt.kafka.kafka_source import resume_positions
            from spark_ckpt.sources.kafka_options import CHANNEL_NAMES

            recorded = latest.properties.get(CHANNEL_NAMES)
            known = None if recorded is None else list(json.loads(recorded))
            new = [c for c, n in enumerate(names) if known is not None and n not in known]
            mine = {c: o for (v, c), o in offsets.items() if v == SOURCE_TASK.vertex}
            earliest = source.earliest(new) if new else {}  # type: ignore[attr-defined]
            positions = resume_positions(names, known, mine, earliest)
        else:
            positions = [offsets.get((SOURCE_TASK.vertex, c), 0) for c in range(source.channels)]
        resume = getattr(source, "resume_from", None)
        if resume is not None:
            resume(positions)
        return StreamOffset.initial(positions, latest.checkpoint_id)

    def default_read_limit(self) -> ReadLimit:
        if self.options.max_rows_per_trigger is not None:
            return ReadMaxRows(self.options.max_rows_per_trigger)
        return ReadAllAvailable()

    def prepare_for_trigger_available_now(self) -> None:
        """Fix the target at the rows produced now. Spark calls this *before*
        ``initialOffset``, so restore the positions first: a restored stream must not aim
        behind where it resumes."""
        self.initial_offset()
        # a source with a per-trigger admission (maxFilesPerTrigger) admits all there is now
        self._target = getattr(self.source, "heads_available_now", self.source.heads)()

    def latest_offset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Source runner. Places the barriers the coordinator triggered and returns the next
        end offset; returns *start* itself when the batch would carry nothing (no micro-batch
        runs, see :meth:`StreamOffset.is_idle_after`)."""
        self._discover()
        self._notify_completed()
        begin = StreamOffset.from_dict(start)
        offset = begin
        target: list[int] | None = None
        if self._target is not None:
            target = [max(t, p) for t, p in zip(self._target, offset.positions, strict=True)]
            # a source with a per-trigger admission (maxFilesPerTrigger) admits that much of
            # the target per batch, as Spark's AvailableNow does
            admit = getattr(self.source, "admit", None)
            heads = target if admit is None else admit(offset.positions, target)
        else:
            heads = self.source.heads()
        self._heads = list(heads)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        barriers = self.host.take_barriers()
        stopping = self.host.stopping  # as of the take: a stop barrier comes with its request
        if stopping is None and not self.host.draining:
            self._stop_at = self._drain_to = None  # (again) no stop under way: one failed
        if self._drain_to is None and self.host.draining:
            self._drain_to = list(heads)  # a stop with drain reads up to the heads as of now
        if self._drain_to is not None:
            # every barrier of the drain, the stop's own included, lands within it
            heads = [min(h, t) for h, t in zip(heads, self._drain_to, strict=True)]
        alignment = self.options.alignment
        for barrier in barriers:
            offset = alignment.place(offset, [barrier], heads, max_rows)
            if stopping is not None and stopping.checkpoint_id == barrier.checkpoint_id:
                self._stop_at = offset.barriers[-1].positions
        if self._stop_at is not None:
            heads = [min(h, s) for h, s in zip(heads, self._stop_at, strict=True)]
        elif self._drain_to is not None and list(offset.positions) == heads:
            # drained: the host takes the final checkpoint (or savepoint); its barrier is
            # placed by the next call, exactly here
            self.host.call(lambda host: host.finish_drain())
        if target is not None:
            offset = self._available_now(offset, heads, target)
        now = self._clock.now_ms()
        end = alignment.next(offset, heads, max_rows, now)
        self._report_channels(end.positions)
        if self.options.watermark is None:
            return start if end.is_idle_after(begin) else end.to_dict()
        idle = self._idle_channels(begin, end, heads, now)
        if end.is_idle_after(begin) and (target is not None or now - begin.batch_ms < TICK_MS):
            # no row, no barrier, and no tick due (Trigger.AvailableNow never ticks: it ends
            # when the offset stops moving)
            return start
        return replace(end.at_time(now, idle), lookups=self._lookup_versions()).to_dict()

    def _lookup_versions(self) -> tuple[tuple[str, int], ...]:
        """The newest version of each lookup table, which the micro-batch being planned
        joins with (recorded in its offsets: a replay joins with the same). One incremental
        log read per table."""
        if not self.options.lookup_tables:
            return ()
        from deltalake.exceptions import DeltaError

        from spark_ckpt.delta.followed_table import FollowedTable

        versions = []
        for path in self.options.lookup_tables:
            followed = self._lookups.get(path)
            if followed is None:
                followed = self._lookups[path] = FollowedTable(path, None)
            try:
                table = followed.newest()
            except (OSError, DeltaError) as e:
                followed.forget()
                raise StoreError(f"lookup table {path}: {e}") from e
            if table is None:
                raise StoreError(f"lookup table {path} does not exist (any more)")
            versions.append((path, int(table.version())))
        return tuple(versions)

    def _report_channels(self, positions: Sequence[int]) -> None:
        """Hand the channels' progress to the coordinator's heartbeat report: where the run
        started, where this batch ends, where the input ends. O(channels)."""
        heads = self._heads
        if self._starts is None:
            self._starts = StreamOffset.from_dict(self.initial_offset()).positions
        starts = self._starts
        if heads is not None and len(starts) == len(positions) == len(heads):
            self.host.report_channels(channel_progress(starts, positions, heads))

    def _idle_channels(
        self, begin: StreamOffset, end: StreamOffset, heads: Sequence[int], now: int
    ) -> list[int]:
        """Event time: the channels that have had no new row for the strategy's idleness
        timeout as of *now* (none without one). A channel is active while the batch reads
        rows of it or it has rows not read yet."""
        strategy = self.options.watermark
        if strategy is None or not strategy.keeps_idleness:
            return []
        if len(self._active_ms) != end.channels:
            self._active_ms = [now] * end.channels
        for c in range(end.channels):
            if end.positions[c] > begin.positions[c] or heads[c] > end.positions[c]:
                self._active_ms[c] = now
        timeouts = [strategy.idleness_of(c) for c in range(end.channels)]
        return [
            c
            for c, timeout in enumerate(timeouts)
            if timeout is not None and now - self._active_ms[c] >= timeout
        ]

    def _discover(self) -> None:
        """Every ``partitionDiscoveryIntervalMs``, for a source that discovers channels
        (Kafka partitions) in a run of a pipeline: if there are new ones, end the run with
        a final checkpoint (:meth:`CoordinatorHost.request_restart`), after which
        ``Pipeline.run`` starts the next run with them."""
        discover = getattr(self.source, "discover", None)
        interval_ms = self.options.discovery_interval_ms
        if discover is None or interval_ms <= 0 or self.options.run_id is None:
            return
        now = time.monotonic()
        if self._restarting or now < self._next_discovery:
            return
        self._next_discovery = now + interval_ms / 1000
        new = discover()
        if new:
            reason = f"new partitions {[f'{t}-{p}' for t, p in new]}"
            log.info("%s: ending the run for a restart that reads them", reason)
            self._restarting = self.host.call(lambda host: host.request_restart(reason))

    def _notify_completed(self) -> None:
        """For a source that acts on completed checkpoints (``checkpoint_completed``: the
        files source cleans what they cover, Kafka commits a group's offsets): hand it the
        positions of each newly completed checkpoint, as Flink's ``notifyCheckpointComplete``."""
        notify = getattr(self.source, "checkpoint_completed", None)
        if notify is None:
            return
        latest = self.host.last_completed  # no wait for a completion in progress
        if latest is None or latest.checkpoint_id == self._notified:
            return
        self._notified = latest.checkpoint_id
        names: list[str] | None = getattr(self.source, "channel_names", None)
        if names is not None:
            from spark_ckpt.sources.kafka_options import CHANNEL_NAMES

            if latest.properties.get(CHANNEL_NAMES) != json.dumps(names):
                return  # taken by an earlier run, over other channels
        offsets = latest.offsets()
        positions = [offsets.get((SOURCE_TASK.vertex, c), 0) for c in range(self.source.channels)]
        notify(latest.checkpoint_id, positions)

    def report_latest_offset(self) -> dict[str, Any] | None:
        """Source runner: the channels' heads (``positions``, per channel, as in the start
        and end offsets) that the last :meth:`latestOffset` saw — what Spark reports as the
        source's ``latestOffset`` in the query's progress (how far the input goes, beyond
        a read limit). None before the first batch. Costs nothing: no source is read."""
        return None if self._heads is None else {"positions": self._heads}

    def _available_now(
        self, offset: StreamOffset, heads: Sequence[int], target: Sequence[int]
    ) -> StreamOffset:
        """Trigger.AvailableNow ends with a final checkpoint at the target positions: once all
        data is admitted, trigger it and let a batch carry its barriers; once they are emitted,
        wait here (polling the coordinator) until it completed. Spark ends the query when the
        end offset equals the start. *heads*: what this batch may read; *target*: where the
        query ends.

        The coordinator decides the final checkpoint: it completes, or fails (expired at its
        timeout, declined) and is triggered again, as long as the tolerable failures allow
        (beyond them the coordinator fails the query). However late its polls make that
        decision, the wait goes on; only a request left undecided past twice the timeout
        (and :data:`FINAL_DECISION_GRACE_S`) fails the query, as a coordinator that hangs."""
        if list(offset.positions) != list(target):
            return offset
        config = self.options.config
        decision_s = (2 * config.timeout_ms + config.min_pause_ms) / 1000 + FINAL_DECISION_GRACE_S
        # a consumer that publishes its topology as the query starts (ckpt-sink) is installed
        # by the host's next poll, which may not have run yet (a second apart on an object
        # store): wait for it that long, polling, before calling it missing
        consumer_deadline = time.monotonic() + CONSUMER_WAIT_S
        while True:
            final = self._final
            if final is not None and final.status is RequestStatus.COMPLETED:
                # done: emit nothing more (Spark ends the query on an unchanged offset) once
                # the completion's sink commit, which may still run on the host thread (the
                # status is set before it), has finished: the query must not end before it
                self.host.sync()
                self._notify_completed()
                return StreamOffset(
                    offset.positions,
                    offset.emitted,
                    tuple(
                        b
                        for b in offset.barriers
                        if b.checkpoint_id <= final.checkpoint_id  # type: ignore[operator]
                    ),
                )
            if final is None or final.status is RequestStatus.FAILED:
                if final is not None:
                    log.warning("final checkpoint failed (%s); retrying", final.failure)
                self._final = self.host.call(lambda host: host.request_final_checkpoint())
                self._final_deadline = time.monotonic() + decision_s
                if self._final is None and time.monotonic() > consumer_deadline:
                    raise CheckpointError(
                        "Trigger.AvailableNow needs a checkpointing consumer (ckpt-sink or the "
                        "foreachBatch aligner) to take its final checkpoint"
                    )
            for barrier in self.host.poll_now():
                offset = offset.place(barrier, heads)
            if any(b.checkpoint_id > e for b in offset.barriers for e in offset.emitted):
                # the next batch emits them: the final barrier, or a periodic one the (queued)
                # final checkpoint waits for; barriers emitted already need no batch
                return offset
            if self._final is not None and time.monotonic() > self._final_deadline:
                # neither completed nor failed (expired, declined: then it is triggered
                # again, as long as the tolerable failures allow): the coordinator is stuck
                raise CheckpointError(
                    f"the final checkpoint of Trigger.AvailableNow was not decided within "
                    f"{decision_s:.0f} s: the coordinator neither completed nor expired it"
                )
            time.sleep(0.05)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        slices = StreamOffset.from_dict(start).plan(StreamOffset.from_dict(end))
        return [
            ChannelPartition(
                s.channel,
                s.start,
                self.source.plan(s.channel, s.start, s.end),
                s.barriers,
                self.schema,
                len(slices),
                self.options.router,
                s.progress,
                self.options.storage,
            )
            for s in slices
        ]

    def stop(self) -> None:
        """Source runner, when the query stops: stop the coordinator's thread; a stop that
        Spark signalled by closing the runner's channel ends the process without a trace."""
        if self._host is not None:
            try:
                if self._source is not None:
                    self._notify_completed()  # a final checkpoint (a stop's, a savepoint)
            except Exception as e:  # the query is ending either way
                log.warning("on stop: the source was not told of the last checkpoint: %s", e)
            self._host.stop()
        close = getattr(self._source, "close", None)
        if close is not None:
            close()
        exit_quietly_if_channel_closed()


def read_partition(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """Executor: the rows of one channel of a micro-batch, with its barrier rows (routed to
    the subtasks on the executor path). Deterministic: a replayed batch reads the same."""
    if not isinstance(partition, ChannelPartition):
        raise ProtocolError(f"not a ckpt-source partition: {partition!r}")
    partition.storage.install()
    user, positions = read_rows(partition.plan)
    table = channel_rows(
        user,
        partition.schema,
        partition.channel,
        partition.start,
        partition.marks,
        partition.channels,
        positions=positions,
        end=partition.plan.end,
        progress=partition.progress,
    )
    if partition.router is None:
        yield from table.to_batches()
    elif table.num_rows:
        yield partition.router.route(table)
    _freeze_worker_heap()
