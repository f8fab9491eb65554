"""The exactly-once barrier handler (Flink's ``SingleCheckpointBarrierHandler``)."""

from __future__ import annotations

import pyarrow as pa

from spark_ckpt.protocol.barrier import CheckpointBarrier
from spark_ckpt.runtime.alignment.aligner_state import AlignerState
from spark_ckpt.runtime.alignment.barrier_handler_state import BarrierHandlerState
from spark_ckpt.runtime.alignment.steps import AbortReason

__all__ = ["SingleCheckpointBarrierHandler"]


class SingleCheckpointBarrierHandler:
    """At most one checkpoint pending at a time; its lifecycle is the current
    :class:`~spark_ckpt.runtime.alignment.barrier_handler_state.BarrierHandlerState`, replaced
    by the state each event returns. The initial (idle) state fixes the mode: see
    :func:`~spark_ckpt.runtime.alignment.barrier_handler.create_barrier_handler`."""

    def __init__(self, initial: BarrierHandlerState) -> None:
        self._state = initial

    @property
    def state(self) -> BarrierHandlerState:
        return self._state

    @property
    def phase(self) -> AlignerState:
        return self._state.phase

    @property
    def pending_checkpoints(self) -> tuple[int, ...]:
        pending = self._state.pending
        return () if pending is None else (pending.checkpoint_id,)

    @property
    def blocked_channels(self) -> frozenset[int]:
        return self._state.blocked_channels

    def route(self, rows: pa.Table) -> None:
        self._state.route(rows)

    def barrier_received(self, channel: int, offset: int, barrier: CheckpointBarrier) -> None:
        self._state = self._state.barrier_received(channel, offset, barrier)

    def abort(self, checkpoint_id: int, reason: AbortReason, message: str) -> bool:
        pending = self._state.pending
        if pending is None or pending.checkpoint_id != checkpoint_id:
            return False
        self._state = self._state.abort(reason, message)
        return True

    def end_of_input(self, channel: int, end_offset: int) -> None:
        self._state = self._state.end_of_input(channel, end_offset)

    def check_timeout(self) -> None:
        self._state = self._state.check_timeout()
