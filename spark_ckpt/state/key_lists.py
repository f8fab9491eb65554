"""Per-key lists as Arrow arrays, both ways, vectorized: the values a key's list state holds
exploded into rows, and rows gathered into one list per key (the form of a key's timers and
of a window operator's open windows, kept as value state of a list type)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc


def exploded(keys: pa.Array, lists: pa.Array) -> tuple[pa.Array, pa.Array]:
    """(owner key, element) per element of each key's list (null lists: none), keys and
    *lists* aligned. O(elements)."""
    return keys.take(pc.list_parent_indices(lists)), pc.list_flatten(lists)


def gathered(
    keys: pa.Array,
    owners: pa.Array | pa.ChunkedArray,
    order_by: npt.NDArray[np.int64],
    values: pa.Array,
    list_type: pa.DataType,
) -> pa.Array:
    """Per key of *keys* (unique), the *values* whose *owners* entry is that key, ordered by
    *order_by* (ties: as given), as a list array of *list_type* aligned with *keys*; null
    for a key with none. Every owner must be one of *keys*. O(values log values), no
    Python per value."""
    if len(values) == 0:
        return pa.nulls(len(keys), list_type)
    code = pc.index_in(owners, value_set=keys).to_numpy(zero_copy_only=False)
    order = np.lexsort((order_by, code))
    counts = np.bincount(code, minlength=len(keys))
    offsets = np.zeros(len(keys) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    empty = pa.array(counts == 0) if bool((counts == 0).any()) else None
    return pa.ListArray.from_arrays(
        pa.array(offsets), values.take(pa.array(order)), type=list_type, mask=empty
    )
