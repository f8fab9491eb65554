"""Timers of one operator's keys, stored as keyed state of its backend (Flink's
``InternalTimerService``; Spark's ``StatefulProcessorHandle.registerTimer``).

A timer is a (key, timestamp) in one of two domains: **event time** (fires once the
watermark reaches its timestamp) or **processing time** (fires once the processing time of a
micro-batch reaches it). Registering the same timer twice keeps one; deleting one that does
not exist does nothing. Each domain's timers are one keyed value state of the operator's
backend — per key, the sorted list of its timestamps (int64 milliseconds since the epoch) —
named :data:`EVENT_TIMERS` / :data:`PROCESSING_TIMERS`, so they are snapshotted
incrementally and changelogged with the operator's state, restored and rescaled by key group,
kept across upgrades by uid, and read and written offline like any keyed state.

Firing (:meth:`TimerService.pop_due`) takes the timers at or below a time out of the state
and returns them ordered by (timestamp, key), so a replayed micro-batch fires the same timers
in the same order. An in-memory index by timestamp, rebuilt from the state when it is not
known (a restore, an image loaded), makes finding them cost the timers due, not the timers
registered. Vectorized: pyarrow over the keys touched, no per-timer Python.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import StateError
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.descriptor import EVENT_TIMERS, PROCESSING_TIMERS, ValueStateDescriptor
from spark_ckpt.state.key_lists import exploded, gathered
from spark_ckpt.state.views import ArrayLike

_TIMESTAMPS: Final = pa.list_(pa.int64())
#: An index holding more than twice the live timers and this many is rebuilt from the state.
_COMPACT_FLOOR: Final = 1024


class TimeDomain(StrEnum):
    EVENT = "event"
    PROCESSING = "processing"

    @property
    def state_name(self) -> str:
        return EVENT_TIMERS if self is TimeDomain.EVENT else PROCESSING_TIMERS

    @property
    def descriptor(self) -> ValueStateDescriptor:
        """The keyed state that holds this domain's timers: per key, its timestamps."""
        return ValueStateDescriptor(self.state_name, _TIMESTAMPS)


def timestamps_ms(values: ArrayLike, n: int) -> pa.Array:
    """Timer timestamps as int64 milliseconds since the epoch: from integers (milliseconds)
    or an Arrow timestamp array. :class:`StateError` for nulls or a length other than *n*."""
    try:
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        array = values if isinstance(values, pa.Array) else pa.array(values)
        if pa.types.is_timestamp(array.type):
            array = pc.cast(pc.cast(array, pa.timestamp("ms", tz=array.type.tz)), pa.int64())
        array = pc.cast(array, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
        raise StateError(f"timer timestamps must be integers (ms) or timestamps: {e}") from e
    if len(array) != n:
        raise StateError(f"{n} keys but {len(array)} timer timestamps")
    if array.null_count:
        raise StateError("a timer needs a timestamp (got null)")
    return array


class TimerService:
    """The timers of the operator whose state is *backend* (see the module docstring). The
    descriptors are registered on construction (call it where the operator registers its
    state: before a restore). Single-threaded, as the backend."""

    def __init__(self, backend: KeyedStateBackend) -> None:
        self.backend = backend
        self._descriptors = {domain: domain.descriptor for domain in TimeDomain}
        for descriptor in self._descriptors.values():
            backend.register(descriptor)
        #: per domain: (key, timestamp) of every registered timer, deleted ones maybe too
        #: (checked against the state when due); None: not known (rebuilt when needed)
        self._index: dict[TimeDomain, pa.Table | None] = dict.fromkeys(TimeDomain)
        #: per domain: how many timers the state holds (when the index is known)
        self._live: dict[TimeDomain, int] = dict.fromkeys(TimeDomain, 0)
        #: the timers registered and fired since the counts were last taken
        self.registered = 0
        self.fired = 0

    def forget_index(self) -> None:
        """The state changed behind the service (a restore, a loaded image, a changelog
        applied): rebuild the index from the state when it is next needed."""
        self._index = dict.fromkeys(TimeDomain)

    def _keys(self, keys: ArrayLike) -> pa.Array:
        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
        array = keys if isinstance(keys, pa.Array) else pa.array(keys, type=self.backend.key_type)
        return array if array.type == self.backend.key_type else array.cast(self.backend.key_type)

    # -- changing ------------------------------------------------------------------------------
    def register(self, domain: TimeDomain, keys: ArrayLike, timestamps: ArrayLike) -> None:
        """Register a timer per (key, timestamp); existing ones are kept once. O(keys)."""
        key_array = self._keys(keys)
        times = timestamps_ms(timestamps, len(key_array))
        if not len(key_array):
            return
        new = self._add(domain, key_array, times)
        self.registered += new.num_rows
        index = self._index[domain]
        if index is not None:
            self._index[domain] = pa.concat_tables([index, new])
            self._live[domain] += new.num_rows

    def delete(self, domain: TimeDomain, keys: ArrayLike, timestamps: ArrayLike) -> None:
        """Delete the timer of each (key, timestamp); a missing one is no error. O(keys)."""
        key_array = self._keys(keys)
        times = timestamps_ms(timestamps, len(key_array))
        if not len(key_array):
            return
        gone = self._remove(domain, key_array, times)
        index = self._index[domain]
        if index is not None:
            # deleted timers stay in the index until due (checked against the state then),
            # unless they make up most of it
            self._live[domain] -= gone.num_rows
            if index.num_rows > 2 * self._live[domain] + _COMPACT_FLOOR:
                self._index[domain] = None

    def _add(self, domain: TimeDomain, keys: pa.Array, times: pa.Array) -> pa.Table:
        """Add the timers (*keys*, *times*) to the state; returns those it gained (key, ts).
        One sort of the keys' timers and the new ones by (key, timestamp): duplicates end
        up side by side, a held one first."""
        descriptor = self._descriptors[domain]
        unique = pc.unique(keys)
        owners, held = exploded(unique, self.backend.get_values(descriptor, unique))
        code = pc.index_in(pa.chunked_array([owners, keys]), value_set=unique)
        codes = code.to_numpy().astype(np.int64)
        stamps = np.concatenate(
            [held.to_numpy(zero_copy_only=False), times.to_numpy(zero_copy_only=False)]
        ).astype(np.int64)
        asked = np.arange(len(stamps)) >= len(held)
        order = np.lexsort((asked, stamps, codes))
        codes, stamps, asked = codes[order], stamps[order], asked[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = (codes[1:] != codes[:-1]) | (stamps[1:] != stamps[:-1])
        new = order[first & asked] - len(held)
        if not len(new):
            return pa.table({"key": keys.slice(0, 0), "ts": times.slice(0, 0)})
        offsets = np.zeros(len(unique) + 1, dtype=np.int32)
        np.cumsum(np.bincount(codes[first], minlength=len(unique)), out=offsets[1:])
        lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(stamps[first]), _TIMESTAMPS)
        self.backend.put_values(descriptor, unique, lists)
        positions = pa.array(new)
        return pa.table({"key": keys.take(positions), "ts": times.take(positions)})

    def _remove(self, domain: TimeDomain, keys: pa.Array, times: pa.Array) -> pa.Table:
        """Remove the timers (*keys*, *times*) from the state; returns those it lost."""
        descriptor = self._descriptors[domain]
        pairs = pa.table({"key": keys, "ts": times}).group_by(["key", "ts"]).aggregate([])
        unique = pc.unique(pairs.column("key"))
        current = self.backend.get_values(descriptor, unique)
        held = _explode(unique, current)
        asked = pairs.select(["key", "ts"])
        merged = _anti_join(held, asked)
        changed = _anti_join(held, merged)
        if changed.num_rows:
            self.backend.put_values(descriptor, unique, _collect(unique, merged))
        return changed

    # -- firing --------------------------------------------------------------------------------
    def pop_due(self, domain: TimeDomain, upto_ms: int) -> pa.Table:
        """The timers of *domain* at or below *upto_ms*, removed from the state, ordered by
        (timestamp, key): a table ``key``, ``ts`` (int64 ms). O(timers due + keys touched)
        once the index is known."""
        index = self._index[domain]
        if index is None:
            index = self._index[domain] = self._rebuild(domain)
        due_mask = pc.less_equal(index.column("ts"), upto_ms)
        if not pc.any(due_mask).as_py():
            return index.schema.empty_table()
        candidates = index.filter(due_mask)
        self._index[domain] = index.filter(pc.invert(due_mask))
        descriptor = self._descriptors[domain]
        unique = pc.unique(candidates.column("key"))
        lists = self.backend.get_values(descriptor, unique)
        parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
        flat = pc.list_flatten(lists).cast(pa.int64())
        late = flat.to_numpy(zero_copy_only=False) <= upto_ms
        due = pa.table({"key": unique.take(pa.array(parents[late])), "ts": flat.filter(late)})
        # each list is sorted: what is left of it stays in order, no sort needed
        left = np.bincount(parents[~late], minlength=len(unique))
        offsets = np.zeros(len(unique) + 1, dtype=np.int32)
        np.cumsum(left, out=offsets[1:])
        kept = pa.ListArray.from_arrays(
            pa.array(offsets),
            flat.filter(pa.array(~late)),
            _TIMESTAMPS,
            mask=pa.array(left == 0),
        )
        self.backend.put_values(descriptor, unique, kept)
        self.fired += due.num_rows
        self._live[domain] -= due.num_rows
        return due.sort_by([("ts", "ascending"), ("key", "ascending")])

    def _rebuild(self, domain: TimeDomain) -> pa.Table:
        descriptor = self._descriptors[domain]
        table = self.backend.to_table(descriptor)
        keys = (
            table.column("key").combine_chunks()
            if table.num_rows
            else pa.array([], self.backend.key_type)
        )
        values = (
            table.column("value").combine_chunks() if table.num_rows else pa.array([], _TIMESTAMPS)
        )
        index = _explode(keys, values)
        self._live[domain] = index.num_rows
        return index

    def count(self, domain: TimeDomain) -> int:
        """How many timers of *domain* are registered (a scan of the state)."""
        values = self.backend.to_table(self._descriptors[domain]).column("value")
        if not len(values):
            return 0
        total: int = pc.sum(pc.list_value_length(values)).as_py() or 0
        return total

    def take_counts(self) -> tuple[int, int]:
        """(registered, fired) since the last call."""
        counts, self.registered, self.fired = (self.registered, self.fired), 0, 0
        return counts


def _explode(keys: pa.Array, lists: pa.Array) -> pa.Table:
    """(key, ts) per timestamp of each key's list (null lists: none)."""
    owners, flat = exploded(keys, lists)
    return pa.table({"key": owners, "ts": flat.cast(pa.int64())})


def _collect(keys: pa.Array, pairs: pa.Table) -> pa.Array:
    """Per key of *keys* (unique), the sorted timestamps of *pairs* (null: none left)."""
    ts = pairs.column("ts").combine_chunks().cast(pa.int64())
    order_by = ts.to_numpy(zero_copy_only=False) if len(ts) else np.empty(0, np.int64)
    return gathered(keys, pairs.column("key"), order_by, ts, _TIMESTAMPS)


def _anti_join(held: pa.Table, removed: pa.Table) -> pa.Table:
    """The rows of *held* (key, ts) not in *removed*."""
    return held.join(removed, keys=["key", "ts"], join_type="left anti", use_threads=False)


# -- offline: timers as rows ------------------------------------------------------------------
#: The columns of timers as rows (:func:`timer_rows`), besides ``key``.
TIMER_ROW_COLUMNS: Final = ("timestamp", "domain")


def timer_rows(states: dict[TimeDomain, pa.Table]) -> pa.Table:
    """The timers of an operator as rows ``key``, ``timestamp`` (int64 ms) and ``domain``,
    ordered by (domain, timestamp, key), from its timer states (per domain a table ``key``,
    ``value``: a key's timestamps; a domain absent has none)."""
    pieces = []
    for domain in TimeDomain:
        table = states.get(domain)
        if table is None or table.num_rows == 0:
            continue
        exploded = _explode(
            table.column("key").combine_chunks(), table.column("value").combine_chunks()
        )
        pieces.append(
            pa.table(
                {
                    "key": exploded.column("key"),
                    "timestamp": exploded.column("ts"),
                    "domain": pa.array([domain.value] * exploded.num_rows, pa.string()),
                }
            ).sort_by([("timestamp", "ascending"), ("key", "ascending")])
        )
    if not pieces:
        return pa.table(
            {
                "key": pa.array([]),
                "timestamp": pa.array([], pa.int64()),
                "domain": pa.array([], pa.string()),
            }
        )
    return pa.concat_tables(pieces, promote_options="default")


def timer_states(rows: pa.Table) -> dict[TimeDomain, pa.Table]:
    """Inverse of :func:`timer_rows`: per domain that has timers, its state as a table
    ``key``, ``value`` (a key's sorted, distinct timestamps). :class:`StateError` for a
    missing column, a null, or an unknown domain."""
    missing = [c for c in ("key", *TIMER_ROW_COLUMNS) if c not in rows.column_names]
    if missing:
        raise StateError(f"timers need columns key, timestamp and domain (missing {missing})")
    domains = rows.column("domain")
    known = {d.value for d in TimeDomain}
    unknown = set(pc.unique(domains).to_pylist()) - known
    if unknown:
        raise StateError(f"unknown timer domains {sorted(map(str, unknown))}: {sorted(known)}")
    if rows.column("key").null_count:
        raise StateError("a timer needs a key (got null)")
    times = timestamps_ms(rows.column("timestamp"), rows.num_rows)
    out: dict[TimeDomain, pa.Table] = {}
    for domain in TimeDomain:
        mine = pc.equal(domains, domain.value)
        pairs = pa.table({"key": rows.column("key").filter(mine), "ts": times.filter(mine)})
        if pairs.num_rows == 0:
            continue
        pairs = pairs.group_by(["key", "ts"]).aggregate([])
        keys = pc.unique(pairs.column("key"))
        out[domain] = pa.table({"key": keys, "value": _collect(keys, pairs)})
    return out
