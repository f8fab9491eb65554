"""Where a ``foreachBatch`` call's time goes: :class:`PhaseTimer`, a
:class:`~spark_ckpt.protocol.trace.Tracer` handed to the run (``Pipeline.prepare(...,
tracer=...)``) that sums the exclusive wall time of the engine's spans per phase.

The phases (:data:`PHASES`) are the engine's :class:`~spark_ckpt.protocol.trace.Phase` spans
under the names the benchmark has always reported (:data:`PHASE_KEYS`), plus two the
benchmark opens itself around the ``foreachBatch`` call: ``toArrow`` (the collect) and
``aligner_other`` (the aligner's ``submit``: whatever its spans do not cover — barrier
alignment, filtering, ticks)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from spark_ckpt.protocol.trace import Phase

#: The benchmark's name of each engine phase. ``notify_completed`` is reported as
#: ``notify_other`` (what is left of it besides the completion polls it encloses); the state
#: write counts as ``snapshot_async``, which enclosed it before the asynchronous phase moved
#: to the snapshot worker.
PHASE_KEYS: dict[Phase, str] = {
    **{p: p.value for p in Phase},
    Phase.NOTIFY_COMPLETED: "notify_other",
    Phase.SNAPSHOT_WRITE: "snapshot_async",
}

#: Phases of a foreachBatch call, in pipeline order.
PHASES = (
    "toArrow",  # Spark job: source read() on executors + transfer to the driver as Arrow
    "list_completed",  # completion poll: completed checkpoints from the store
    "committed_checkpoint",  # completion poll: the sink's Delta app version
    "notify_other",  # rest of applying completions (incremental base bookkeeping)
    "route",  # rows to subtasks by key group
    "operator",  # RunningCount.process_batch (keyed state get/put)
    "sink_write",  # DeltaSinkWriter.write: encoding into the in-progress Parquet file
    "snapshot_sync",  # the synchronous snapshot minus pre_commit: state backend snapshot
    "sink_pre_commit",  # DeltaSinkWriter.pre_commit: closing the in-progress file, sealing
    "snapshot_async",  # the asynchronous phase on the task's thread (+ the write when inline)
    "mailbox",  # acks posted as files
    "aligner_other",  # the rest of BatchAligner.submit (barrier alignment, filtering, tick)
)
assert set(PHASE_KEYS.values()) <= set(PHASES)

#: Phases of a foreachBatch call that only checkpointing causes (or that it makes costlier).
CHECKPOINT_PHASES = (
    "list_completed",
    "committed_checkpoint",
    "notify_other",
    "snapshot_sync",
    "sink_pre_commit",
    "snapshot_async",
    "mailbox",
    "aligner_other",
)


class PhaseTimer:
    """Exclusive wall time per phase: a nested span's time is subtracted from the span
    around it, on each thread, so the phases of a call add up to its wall time.

    Spans on the foreachBatch thread (:attr:`owner`, one batch at a time) are summed into
    :attr:`totals` (taken per batch by :meth:`reset`); spans on any other thread — the
    aligner's snapshot worker, its processing thread when pipelined — into
    :attr:`background` (:meth:`take_background`): they are off the micro-batch's path.
    Thread-safe. Pickling gives a new, empty timer (it then records in the process that
    unpickled it)."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.background: dict[str, float] = defaultdict(float)
        self.owner: int | None = None
        self._local = threading.local()  # .stack: time in timed children, per open span
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[type[PhaseTimer], tuple[()]]:
        return (PhaseTimer, ())

    def span(self, phase: Phase) -> AbstractContextManager[None]:
        """The :class:`~spark_ckpt.protocol.trace.Tracer` hook."""
        return self.phase(PHASE_KEYS[phase])

    def reset(self) -> dict[str, float]:
        """The owner thread's totals since the last call (call it on that thread)."""
        out = dict(self.totals)
        self.totals.clear()
        return out

    def take_background(self) -> dict[str, float]:
        """The other threads' totals since the last call."""
        with self._lock:
            out = dict(self.background)
            self.background.clear()
        return out

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        stack: list[float] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        stack.append(0.0)
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            exclusive = elapsed - stack.pop()
            if stack:
                stack[-1] += elapsed
            if self.owner is None or threading.get_ident() == self.owner:
                self.totals[name] += exclusive
            else:
                with self._lock:
                    self.background[name] += exclusive
