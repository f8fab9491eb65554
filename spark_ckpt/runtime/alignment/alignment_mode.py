"""The alignment modes of a barrier aligner."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["AlignmentMode"]


class AlignmentMode(StrEnum):
    """How barriers of one checkpoint are aligned across the channels of an input."""

    ALIGNED = "aligned"
    UNALIGNED = "unaligned"
    AT_LEAST_ONCE = "at_least_once"
