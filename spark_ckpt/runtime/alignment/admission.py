"""Input admission of a barrier aligner: the schema of its input and the channels still open."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from spark_ckpt.errors import ProtocolError
from spark_ckpt.protocol.barrier import BARRIER_FIELDS, CHANNEL, CHECKPOINT_ID

__all__ = ["InputAdmission"]


class InputAdmission:
    """Checks each input table before it is processed.

    The first table fixes the schema (it must hold every barrier column with its type); later
    tables must have exactly that schema, with two exceptions for the channels of a later
    stage (:mod:`spark_ckpt.runtime.stage_output`), whose upstream subtasks may not have
    emitted a row yet: while the schema has no column but the barrier columns, a table with
    more fixes it instead; and a table of control rows only is given the schema (its other
    columns null). Every row's ``_ckpt_channel`` must be a known channel
    that is still open: a channel closes when :meth:`close` is called (at the
    ``end_of_input`` call, before its in-band end is processed) and never reopens. The channel
    check is vectorized: 1-2 numpy passes per chunk when the open channels are a contiguous
    range, else a lookup table."""

    def __init__(self, channels: tuple[int, ...]) -> None:
        self._channels = channels
        self._known = frozenset(channels)
        self._schema: pa.Schema | None = None
        self._closed: set[int] = set()
        self._accepted: frozenset[int] = frozenset(channels)
        self._accepted_range: tuple[int, int] | None = None
        self._accepted_lut = np.zeros(0, dtype=bool)
        self._refresh()

    def knows(self, channel: int) -> bool:
        return channel in self._known

    def is_closed(self, channel: int) -> bool:
        return channel in self._closed

    def close(self, channel: int) -> None:
        """Rows on *channel* are refused from now on."""
        self._closed.add(channel)
        self._refresh()

    def admit(self, table: pa.Table) -> pa.Table:
        """Check the schema and that every row's channel accepts rows (O(rows) in numpy);
        returns *table*, or its control rows in the schema (see the class). Raises
        :class:`ProtocolError`."""
        schema = table.schema
        if self._schema is None or (
            len(self._schema) == len(BARRIER_FIELDS) and len(schema) > len(self._schema)
        ):
            for f in BARRIER_FIELDS:
                idx = schema.get_field_index(f.name)
                if idx < 0 or not schema.field(idx).type.equals(f.type):
                    raise ProtocolError(f"input lacks barrier column {f.name}: {f.type}")
            self._schema = schema
        elif not schema.equals(self._schema):
            table = self._conform(table)
        col = table.column(CHANNEL)
        if col.null_count:
            raise ProtocolError(f"null {CHANNEL}")
        for chunk in col.chunks:
            if not len(chunk):
                continue
            values = chunk.to_numpy()
            if self._channels_accepted(values):
                continue
            bad = sorted(
                {int(v) for v in np.unique(values) if int(v) not in self._accepted}
            )  # error path: unique() is vectorized, the loop runs over distinct channels
            raise ProtocolError(f"rows on unknown or ended channels {bad}")
        return table

    def _conform(self, table: pa.Table) -> pa.Table:
        """*table* in the known schema: the same columns in another order, or control rows
        only with fewer columns (their other columns null). Raises :class:`ProtocolError`
        for anything else."""
        known = self._schema
        assert known is not None
        schema = table.schema
        names = set(schema.names)
        fits = all(
            schema.field(f.name).type.equals(f.type) for f in known if f.name in names
        ) and names <= set(known.names)
        control_only = table.column(CHECKPOINT_ID).null_count == 0
        if not fits or (names != set(known.names) and not control_only):
            raise ProtocolError(f"input schema changed: {schema} != {known}")
        return pa.Table.from_arrays(
            [
                table.column(f.name) if f.name in names else pa.nulls(table.num_rows, f.type)
                for f in known
            ],
            schema=known,
        )

    def _channels_accepted(self, values: Any) -> bool:
        """Whether every channel id in the int32 array *values* accepts rows (1-2 passes)."""
        accepted = self._accepted_range
        if accepted is not None and accepted[0] == 0:
            # one pass: negative ids wrap around to huge unsigned values
            return int(values.view(np.uint32).max()) <= accepted[1]
        lo, hi = int(values.min()), int(values.max())
        if accepted is not None:
            return lo >= accepted[0] and hi <= accepted[1]
        return lo >= 0 and hi < len(self._accepted_lut) and bool(self._accepted_lut[values].all())

    def _refresh(self) -> None:
        acc = frozenset(c for c in self._channels if c not in self._closed)
        self._accepted = acc
        if acc and max(acc) - min(acc) + 1 == len(acc):
            self._accepted_range = (min(acc), max(acc))
        else:
            self._accepted_range = None
        lut = np.zeros(max(self._channels) + 1, dtype=bool)
        lut[list(acc)] = True
        self._accepted_lut = lut
