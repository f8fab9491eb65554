"""The checkpoints that complete while a pipeline runs, counted across its runs and handed to
the user's ``on_checkpoint`` callback."""

from __future__ import annotations

from collections.abc import Callable

from spark_ckpt.client.pipeline_client import PipelineClient
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint


class CheckpointReporter:
    """Counts the checkpoints that complete while :meth:`Pipeline.run` supervises, across its
    runs, and hands each to ``on_checkpoint`` once, oldest first.

    Runs in the user's driver, polled every ``poll_s``. Which checkpoints completed comes
    from the statistics history and the log (:meth:`CompletedCheckpoints.completed_ids
    <spark_ckpt.storage.checkpoint_store.CompletedCheckpoints.completed_ids>`): the history records
    every completed checkpoint before retention may remove it, so the count is exact however
    fast checkpoints complete. ``on_checkpoint`` gets the :class:`CompletedCheckpoint`
    (state handles, source offsets) of those retention still keeps at the poll: with
    ``checkpoint.retained`` 1 and an interval shorter than ``poll_s`` a checkpoint may be
    subsumed before the driver looks, and is then counted but not handed over (as Flink's
    completion notifications, best effort for subsumed checkpoints); its figures stay in
    the history."""

    def __init__(
        self,
        client: PipelineClient,
        on_checkpoint: Callable[[CompletedCheckpoint], None] | None,
    ) -> None:
        self.client = client
        self.on_checkpoint = on_checkpoint
        #: The newest id before the first report: later ids are this call's.
        self.baseline = max(self._completed_ids(), default=0)
        #: Checkpoints completed since the baseline, reported or subsumed before a poll.
        self.count = 0
        # the ids counted, within REPORT_WINDOW of the newest: a savepoint may complete after
        # a checkpoint with a higher id (a forced savepoint runs beside checkpoints)
        self._counted: set[int] = set()

    def _completed_ids(self) -> set[int]:
        return set(self.client.store.completed_ids())

    def report(self) -> list[CompletedCheckpoint]:
        """The retained checkpoints completed since the last call (by id), handed to
        ``on_checkpoint``; every newly completed one is counted."""
        completed = self._completed_ids()
        # read after the history: a checkpoint completing in between is in this list
        retained = self.client.checkpoints()
        completed.update(c.checkpoint_id for c in retained)
        newest = max([*completed, *self._counted], default=0)
        floor = max(self.baseline, newest - REPORT_WINDOW)
        fresh = {i for i in completed if i > floor} - self._counted
        self.count += len(fresh)
        self._counted = {i for i in self._counted | fresh if i > floor}
        handed = [c for c in retained if c.checkpoint_id in fresh]
        if self.on_checkpoint is not None:
            for cp in handed:
                self.on_checkpoint(cp)
        return handed


#: How far behind the newest completed checkpoint id a completion is still reported (ids, a
#: bound on the reporter's memory): a savepoint completing after this many newer checkpoints.
REPORT_WINDOW = 10_000
