"""Vectorized split of a run of data rows by channel."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.protocol.barrier import CHANNEL

__all__ = ["partition_rows"]


def partition_rows(
    rows: pa.Table, channels: frozenset[int], lut_size: int, rest: bool = True
) -> tuple[pa.Table | None, pa.Table | None]:
    """``(rows of channels, other rows)``, each side None when empty; the other rows are only
    computed when *rest* (else None). Each side keeps the row order of *rows*.

    One mask over ``_ckpt_channel`` (an equality for one channel, else a numpy lookup table of
    *lut_size* = largest channel id + 1 entries); no filter when the mask is all-true or
    all-false (the input table is returned as is)."""
    col = rows.column(CHANNEL)
    if len(channels) == 1:
        mask = pc.equal(col, pa.scalar(next(iter(channels)), pa.int32()))
    else:
        lut = np.zeros(lut_size, dtype=bool)
        lut[list(channels)] = True
        mask = pa.array(lut[col.to_numpy()])
    hits = pc.sum(mask).as_py() or 0
    if hits == 0:
        return None, rows
    if hits == rows.num_rows:
        return rows, None
    return rows.filter(mask), rows.filter(pc.invert(mask)) if rest else None
