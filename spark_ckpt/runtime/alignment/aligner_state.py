"""The lifecycle phase a barrier aligner reports (:attr:`BarrierAligner.state`)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["AlignerState"]


class AlignerState(StrEnum):
    """Lifecycle of an aligner (of its oldest pending checkpoint when one is pending).

    ``IDLE``: no checkpoint pending. ``ALIGNING``: aligned checkpoint, some channels blocked.
    ``UNALIGNED_COLLECTING``: snapshot taken, collecting in-flight rows of the channels whose
    barrier is still due. ``TRACKING``: at-least-once, some but not all barriers seen.
    ``FINISHED``: every channel ended. ``FAILED``: a protocol error was raised; terminal.

    Each :class:`~spark_ckpt.runtime.alignment.barrier_handler_state.BarrierHandlerState`
    reports one of the first three (its ``phase``); the at-least-once tracker reports ``IDLE``
    or ``TRACKING``; ``FINISHED`` and ``FAILED`` are decided by the facade."""

    IDLE = "idle"
    ALIGNING = "aligning"
    UNALIGNED_COLLECTING = "unaligned_collecting"
    TRACKING = "tracking"
    FINISHED = "finished"
    FAILED = "failed"
