"""What an aligner remembers about barriers across checkpoints: per-channel progress, ended
channels, and which checkpoint ids were started or given up."""

from __future__ import annotations

from collections.abc import Mapping

from spark_ckpt.errors import ProtocolError

__all__ = ["BarrierLedger"]


class BarrierLedger:
    """Barrier bookkeeping shared by every handler and state of one aligner.

    * ``last barrier`` of a channel: the highest checkpoint id it delivered a barrier for (0
      before the first). A barrier must be strictly newer than its channel's last one, unless
      its checkpoint was aborted (:meth:`admit_barrier`).
    * ``ended``: channel -> end offset (one past its last data row), in the order the ends
      were processed.
    * ``max_started``: the newest checkpoint started here; a barrier ``<= max_started`` that is
      not pending is late (its checkpoint was skipped or finished) and ignored by the handlers.
    * ``aborted``: aborted or cancelled ids above the prune floor; the floor is the oldest
      last barrier among live (not ended) channels, raised by :meth:`prune`. Ids at or below
      the floor are forgotten: every live channel has passed them."""

    def __init__(self, channels: tuple[int, ...]) -> None:
        self._last_barrier: dict[int, int] = dict.fromkeys(channels, 0)
        self._ended: dict[int, int] = {}
        self._aborted: set[int] = set()
        self._prune_floor = 0
        self._max_started = 0

    @property
    def ended(self) -> Mapping[int, int]:
        """Ended channel -> its end offset (a live view; do not mutate)."""
        return self._ended

    @property
    def all_ended(self) -> bool:
        return len(self._ended) == len(self._last_barrier)

    @property
    def max_started(self) -> int:
        return self._max_started

    def admit_barrier(self, channel: int, checkpoint_id: int) -> bool:
        """Record barrier *checkpoint_id* on *channel*. False: its checkpoint was aborted here,
        ignore the barrier. Raises :class:`ProtocolError` for a barrier not newer than the
        channel's last one. Prunes the aborted ids either way."""
        n = checkpoint_id
        if n in self._aborted:
            self._last_barrier[channel] = max(self._last_barrier[channel], n)
            self.prune()
            return False
        if n <= self._last_barrier[channel]:
            raise ProtocolError(
                f"barrier {n} on channel {channel} after barrier {self._last_barrier[channel]}"
            )
        self._last_barrier[channel] = n
        self.prune()
        return True

    def mark_started(self, checkpoint_id: int) -> None:
        self._max_started = checkpoint_id

    def mark_aborted(self, checkpoint_id: int) -> None:
        self._aborted.add(checkpoint_id)

    def is_undecided(self, checkpoint_id: int) -> bool:
        """Neither started, skipped, aborted nor forgotten here: a cancel for it is news."""
        n = checkpoint_id
        return n not in self._aborted and n > max(self._max_started, self._prune_floor)

    def end(self, channel: int, end_offset: int) -> None:
        """*channel* ended at *end_offset*; call :meth:`prune` once the handler processed it."""
        self._ended[channel] = end_offset

    def prune(self) -> None:
        """Forget aborted ids every live channel has passed (their barriers can only come again
        as protocol errors now)."""
        live = [b for c, b in self._last_barrier.items() if c not in self._ended]
        if live and min(live) > self._prune_floor:
            self._prune_floor = min(live)
            self._aborted = {n for n in self._aborted if n > self._prune_floor}
