"""Items of blocked channels held back during an aligned checkpoint."""

from __future__ import annotations

import pyarrow as pa

from spark_ckpt.runtime.alignment.items import ControlRow, Item

__all__ = ["ChannelBuffer"]


class ChannelBuffer:
    """Held items (data runs, control rows, ends of input of blocked channels) in arrival
    order, and the released ones waiting to be processed again.

    Lifecycle of an item: :meth:`hold` → (:meth:`release`) → :meth:`take_released`, which hands
    it back to the aligner's queue. Items are never emitted from here: released items go through
    the aligner again (they may hold the next barrier, or be held again by a newer aligned
    checkpoint). ``rows`` counts held data rows plus one per held control row (ends of input
    count 0); ``nbytes`` counts held data only. Both drop to 0 on :meth:`release`."""

    def __init__(self) -> None:
        self._held: list[Item] = []
        self._released: list[Item] = []
        self._rows = 0
        self._bytes = 0

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def nbytes(self) -> int:
        return self._bytes

    def hold(self, item: Item) -> None:
        self._held.append(item)
        if isinstance(item, pa.Table):
            self._rows += item.num_rows
            self._bytes += item.nbytes
        elif isinstance(item, ControlRow):
            self._rows += 1

    def release(self) -> None:
        """Everything held becomes released (behind items released earlier and not taken)."""
        self._released.extend(self._held)
        self._held = []
        self._rows = 0
        self._bytes = 0

    def take_released(self) -> list[Item]:
        """The released items in order, consecutive data runs concatenated into one table (one
        pass through the aligner instead of one per held run); empty when nothing was released.
        """
        if not self._released:
            return []
        merged: list[Item] = []
        run: list[pa.Table] = []
        for item in self._released:
            if isinstance(item, pa.Table):
                run.append(item)
                continue
            if run:
                merged.append(pa.concat_tables(run))
                run = []
            merged.append(item)
        if run:
            merged.append(pa.concat_tables(run))
        self._released = []
        return merged
