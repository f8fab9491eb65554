"""Tracing hooks. Like the :class:`~spark_ckpt.protocol.clock.Clock`, a :class:`Tracer` is
handed to the engine rather than looked up: the foreachBatch aligner
(:class:`~spark_ckpt.spark.driver.batch_aligner.BatchAligner`) and its operator tasks
(:class:`~spark_ckpt.runtime.task.OperatorTask`) open a *span* around each phase of their
work (:class:`Phase`), and the tracer decides what to do with it — nothing, by default
(:data:`NOOP_TRACER`), or time it (the pipeline benchmark's phase timer).

Contract for implementations:

* **Where spans run.** In the process that runs the foreachBatch aligner (the user's driver,
  or a Spark Connect server's Python process). Phases of a micro-batch run on the thread that
  processes it: Spark's foreachBatch thread, or the aligner's processing thread when it is
  pipelined. The asynchronous phase of a checkpoint (:attr:`Phase.SNAPSHOT_WRITE`), the
  acknowledgements it posts (:attr:`Phase.MAILBOX`) and the completion polls
  (:attr:`Phase.LIST_COMPLETED`, :attr:`Phase.COMMITTED_CHECKPOINT`) run on the aligner's
  snapshot worker thread when snapshots are asynchronous. So ``span`` may be called from
  several threads at once: implementations must be thread-safe.
* **Nesting.** Spans of different phases nest on one thread: :attr:`Phase.SINK_PRE_COMMIT`
  inside :attr:`Phase.SNAPSHOT_SYNC`, the completion poll inside
  :attr:`Phase.NOTIFY_COMPLETED` (synchronous snapshots), :attr:`Phase.SNAPSHOT_WRITE` inside
  :attr:`Phase.SNAPSHOT_ASYNC` (written inline). A tracer that wants exclusive time per phase
  subtracts the time of nested spans. A span is closed on every exit, including an
  exception.
* **Cost.** Spans sit on the per-batch path (a few per micro-batch and subtask, one per
  operator call): ``span`` must be cheap and must not block, fail or call back into the
  engine.
* **Picklable.** A tracer is part of the picklable foreachBatch spec
  (:class:`~spark_ckpt.spark.driver.foreach_batch.AlignerSpec`), which crosses a process boundary
  under Spark Connect; a tracer holding locks or files must re-create them on unpickling
  (and then records in the process that unpickled it).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from enum import StrEnum
from typing import Final, Protocol


class Phase(StrEnum):
    """The phases the engine opens spans for (the value is a stable name for reports)."""

    #: Reading the completed checkpoints from the checkpoint store (completion poll).
    LIST_COMPLETED = "list_completed"
    #: Asking the sink which checkpoint it committed last (completion poll, notify_complete).
    COMMITTED_CHECKPOINT = "committed_checkpoint"
    #: Applying completions and aborts to the tasks at the start of a micro-batch (encloses
    #: the completion poll when snapshots are synchronous).
    NOTIFY_COMPLETED = "notify_completed"
    #: Routing a micro-batch's rows to the subtasks owning their key groups.
    ROUTE = "route"
    #: One operator's ``process_batch`` call (keyed state reads and writes).
    OPERATOR = "operator"
    #: Handing a task's output to the sink (staged into its open transaction).
    SINK_WRITE = "sink_write"
    #: A task's synchronous snapshot phase: every state backend's consistent copy (encloses
    #: :attr:`SINK_PRE_COMMIT`).
    SNAPSHOT_SYNC = "snapshot_sync"
    #: Sealing the sink's open transaction at a snapshot.
    SINK_PRE_COMMIT = "sink_pre_commit"
    #: A task's asynchronous phase, on the task's thread: collecting the snapshot (state,
    #: channel state, sealed transactions) and handing it to be written (encloses
    #: :attr:`SNAPSHOT_WRITE` when that runs inline).
    SNAPSHOT_ASYNC = "snapshot_async"
    #: Writing a task's snapshot into the checkpoint store (the snapshot worker's thread when
    #: snapshots are asynchronous).
    SNAPSHOT_WRITE = "snapshot_write"
    #: Posting acknowledgements and declines to the coordinator's mailbox.
    MAILBOX = "mailbox"


class Tracer(Protocol):
    """Receives the engine's spans; see the module docstring for the contract."""

    def span(self, phase: Phase) -> AbstractContextManager[None]:
        """A context manager around one occurrence of *phase*."""
        ...


_NULL_SPAN: Final[AbstractContextManager[None]] = nullcontext()


class NoopTracer:
    """The default tracer: every span is one shared, empty context manager (a method call
    and an empty ``with``, well under a microsecond per span). Picklable; all instances are
    equal."""

    __slots__ = ()

    def span(self, phase: Phase) -> AbstractContextManager[None]:
        return _NULL_SPAN

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NoopTracer)

    def __hash__(self) -> int:
        return hash(NoopTracer)

    def __repr__(self) -> str:
        return "NoopTracer()"


#: The tracer the engine uses when given none.
NOOP_TRACER: Final = NoopTracer()
