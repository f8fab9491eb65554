"""State TTL: the states of one operator that expire (Flink's ``TtlStateFactory`` and its
decorated states; Spark's ``TTLConfig`` with its expiry index and end-of-batch cleanup).

A descriptor with a TTL (:class:`~spark_ckpt.state.descriptor.StateTtlConfig`) is stored
under its storage descriptor (:func:`~spark_ckpt.state.descriptor.ttl_storage`): each value,
list element or map value with the time of its last update. :class:`TtlStates` gives the
operator views that unwrap it:

* **Never returned once expired.** An entry updated at *t* is expired once the processing
  time (the micro-batch's, :class:`~spark_ckpt.state.context.TimeView`) reaches
  ``t + ttl``. A read of an expired entry returns nothing and purges it (a write: the
  change is checkpointed).
* **Refreshed** by writes, and by reads too with ``OnReadAndWrite``; a list element or map
  entry has its own time.
* **Purged at the end of each micro-batch and before each snapshot** (:meth:`TtlStates.purge`,
  called by the task when time moves): an in-memory index of (key, expiry) per state, fed by
  the writes and rebuilt from the state when the state changed behind it (a restore, an
  image), finds the keys that may have expired; their entries are checked and the expired
  ones removed. So state, changelog and checkpoints shrink as entries expire, and a restore
  keeps each entry's time of last update: a savepoint restored later neither revives an
  expired entry nor expires a live one early.

Both the expiry and the purge follow the processing time recorded in the replayable source
positions, so a replayed micro-batch sees and purges the same entries. Single-threaded, as
the backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import StateError
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.descriptor import (
    TTL_UPDATED,
    ListStateDescriptor,
    MapStateDescriptor,
    StateDescriptor,
    StateKind,
    TtlUpdate,
    ValueStateDescriptor,
    python_value,
    ttl_storage,
)
from spark_ckpt.state.views import ArrayLike, ListState, MapState, ValueState

#: An index holding more than this many rows per live key, and this many, is rebuilt.
_COMPACT_PER_KEY: Final = 4
_COMPACT_FLOOR: Final = 4096


class TtlStates:
    """The states with a TTL of the operator whose state is *backend*; *now* returns the
    processing time (ms since the epoch) the subtask has reached. See the module docstring."""

    def __init__(self, backend: KeyedStateBackend, now: Callable[[], int]) -> None:
        self.backend = backend
        self._now = now
        #: per state name: the operator's descriptor (with its TTL) and its storage one
        self._states: dict[str, tuple[StateDescriptor, StateDescriptor]] = {}
        #: per state name: (key, expiry ms) of entries that may expire; None: not known
        self._index: dict[str, pa.Table | None] = {}
        #: entries found expired (and removed) since the count was last taken
        self.expired = 0

    # -- registration ----------------------------------------------------------------------------
    def names(self) -> list[str]:
        """The states with a TTL registered so far, sorted."""
        return sorted(self._states)

    def storage(self, descriptor: StateDescriptor) -> StateDescriptor:
        """Register *descriptor* (with a TTL); returns the descriptor it is stored under.
        Its TTL may change from one registration (a job version) to the next."""
        stored = ttl_storage(descriptor)
        self.backend.register(stored)
        known = self._states.get(descriptor.name)
        self._states[descriptor.name] = (descriptor, stored)
        if known is None:
            self._index.setdefault(descriptor.name, None)
        return stored

    def ttl_ms(self, name: str) -> int:
        """The TTL of state *name*, in ms."""
        ttl = self._states[name][0].ttl
        assert ttl is not None
        return ttl.ttl_ms

    def refresh_on_read(self, name: str) -> bool:
        """Whether reads of state *name* refresh its entries."""
        ttl = self._states[name][0].ttl
        return ttl is not None and ttl.update is TtlUpdate.ON_READ_AND_WRITE

    def now(self) -> int:
        """The processing time the subtask has reached (ms since the epoch)."""
        return self._now()

    def is_expired(self, name: str, updated: int, now: int) -> bool:
        """Whether an entry of state *name* last updated at *updated* is expired at *now*."""
        return updated + self.ttl_ms(name) <= now

    def _noted(self, name: str, keys: pa.Array, expiries: pa.Array) -> None:
        """Entries of *keys* may expire at *expiries*."""
        index = self._index.get(name)
        if index is not None and len(keys):
            new = pa.table({"key": keys, "expires": expiries.cast(pa.int64())})
            self._index[name] = pa.concat_tables([index, new])

    def noted_one(self, name: str, key: Any, expires: int) -> None:
        """The entry of *key* in state *name* may expire at *expires*."""
        if self._index.get(name) is not None:
            self._noted(
                name, pa.array([key], self.backend.key_type), pa.array([expires], pa.int64())
            )

    # -- per-record views --------------------------------------------------------------------------
    def value_state(self, descriptor: ValueStateDescriptor) -> TtlValueState:
        stored = self.storage(descriptor)
        assert isinstance(stored, ValueStateDescriptor)
        return TtlValueState(self, descriptor, self.backend.value_state(stored))

    def list_state(self, descriptor: ListStateDescriptor) -> TtlListState:
        stored = self.storage(descriptor)
        assert isinstance(stored, ListStateDescriptor)
        return TtlListState(self, descriptor, self.backend.list_state(stored))

    def map_state(self, descriptor: MapStateDescriptor) -> TtlMapState:
        stored = self.storage(descriptor)
        assert isinstance(stored, MapStateDescriptor)
        return TtlMapState(self, descriptor, self.backend.map_state(stored))

    # -- vectorized access to value state ----------------------------------------------------------
    def get_values(self, descriptor: ValueStateDescriptor, keys: ArrayLike) -> pa.Array:
        """The live value of each key (null where it has none or it expired), as
        :meth:`StateContext.get_values <spark_ckpt.state.context.StateContext.get_values>`;
        expired entries are purged, and with ``OnReadAndWrite`` the live ones refreshed.
        Vectorized over the keys."""
        stored = self.storage(descriptor)
        assert isinstance(stored, ValueStateDescriptor)
        found = self.backend.get_values(stored, keys)
        if not isinstance(keys, pa.Array | pa.ChunkedArray):
            keys = pa.array(keys, self.backend.key_type)
        value, updated = found.flatten()  # the parent's nulls carried into both
        now = self.now()
        expired = pc.fill_null(
            pc.less_equal(pc.add(updated, self.ttl_ms(descriptor.name)), now), False
        )
        n_expired = pc.sum(expired).as_py() or 0
        if n_expired:
            gone = pc.unique(pc.filter(keys, expired))
            self.backend.clear_values(stored, gone)
            self.expired += len(gone)
            value = pc.if_else(expired, pa.nulls(len(value), value.type), value)
        if self.refresh_on_read(descriptor.name):
            live = pc.is_valid(value)
            if pc.any(live).as_py():
                self._put(descriptor, stored, pc.filter(keys, live), pc.filter(value, live), now)
        return value

    def put_values(
        self, descriptor: ValueStateDescriptor, keys: ArrayLike, values: ArrayLike
    ) -> None:
        """Set each key's value, updated now (a null clears it). Vectorized."""
        stored = self.storage(descriptor)
        assert isinstance(stored, ValueStateDescriptor)
        if not isinstance(values, pa.Array | pa.ChunkedArray):
            values = pa.array(values, descriptor.value_type)
        if not isinstance(keys, pa.Array | pa.ChunkedArray):
            keys = pa.array(keys, self.backend.key_type)
        self._put(descriptor, stored, keys, values, self.now())

    def _put(
        self,
        descriptor: ValueStateDescriptor,
        stored: ValueStateDescriptor,
        keys: pa.Array | pa.ChunkedArray,
        values: pa.Array | pa.ChunkedArray,
        now: int,
    ) -> None:
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
        try:
            if values.type != descriptor.value_type:
                values = values.cast(descriptor.value_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise StateError(f"values are not {descriptor.value_type}: {e}") from e
        stamps = pa.array([now] * len(values), pa.int64())
        wrapped = pa.StructArray.from_arrays(
            [values, stamps],
            fields=list(stored.value_type),
            mask=pc.is_null(values),
        )
        self.backend.put_values(stored, keys, wrapped)
        live = pc.is_valid(values)
        self._noted(
            descriptor.name,
            pc.filter(keys, live),
            pa.array(
                [now + self.ttl_ms(descriptor.name)] * (pc.sum(live).as_py() or 0), pa.int64()
            ),
        )

    # -- purging -----------------------------------------------------------------------------------
    def purge(self) -> int:
        """Remove every entry expired at the current processing time; returns how many.
        O(entries due + keys touched) once the index is known; rebuilding it scans the
        state once (vectorized)."""
        now = self.now()
        total = 0
        for name in list(self._states):
            index = self._index.get(name)
            if index is None:
                index = self._rebuild(name)
            due = pc.less_equal(index.column("expires"), now)
            if not pc.any(due).as_py():
                self._index[name] = index
                continue
            keys = pc.unique(index.column("key").filter(due))
            self._index[name] = index.filter(pc.invert(due))
            total += self._purge_keys(name, keys, now)
        self.expired += total
        return total

    def _purge_keys(self, name: str, keys: pa.Array, now: int) -> int:
        descriptor, stored = self._states[name]
        ttl = self.ttl_ms(name)
        if isinstance(stored, ValueStateDescriptor):
            found = self.backend.get_values(stored, keys)
            _, updated = found.flatten()
            expired = pc.fill_null(pc.less_equal(pc.add(updated, ttl), now), False)
            gone = keys.filter(expired)
            if len(gone):
                self.backend.clear_values(stored, gone)
            return len(gone)
        entries = self.backend.get_entries(stored, keys)
        removed = 0
        changed_keys: list[Any] = []
        changed: list[Any] = []
        next_keys: list[Any] = []
        next_expiry: list[int] = []
        for key, entry in zip(keys.to_pylist(), entries, strict=True):
            if not entry:
                continue
            if descriptor.kind is StateKind.LIST:
                live = [e for e in entry if e[TTL_UPDATED] + ttl > now]
                oldest = [e[TTL_UPDATED] for e in live]
                n_live = len(live)
                kept: Any = live
            else:
                kept = {k: v for k, v in entry.items() if v[TTL_UPDATED] + ttl > now}
                oldest = [v[TTL_UPDATED] for v in kept.values()]
                n_live = len(kept)
            if n_live < len(entry):
                removed += len(entry) - n_live
                changed_keys.append(key)
                changed.append(kept)
            if oldest:
                next_keys.append(key)
                next_expiry.append(min(oldest) + ttl)
        if changed_keys:
            self.backend.put_entries(stored, pa.array(changed_keys, self.backend.key_type), changed)
        self._noted(
            name, pa.array(next_keys, self.backend.key_type), pa.array(next_expiry, pa.int64())
        )
        return removed

    def _rebuild(self, name: str) -> pa.Table:
        """The index of state *name* from its entries: per key, its earliest expiry."""
        _, stored = self._states[name]
        table = self.backend.to_table(stored)
        ttl = self.ttl_ms(name)
        keys = table.column("key").combine_chunks()
        values = table.column("value").combine_chunks()
        if isinstance(stored, ValueStateDescriptor):
            updated = values.flatten()[1]
            index = pa.table({"key": keys, "expires": pc.add(updated, ttl)})
        else:
            if isinstance(stored, MapStateDescriptor):  # its map values, as lists
                values = pa.ListArray.from_arrays(
                    values.offsets, values.items, mask=pc.is_null(values)
                )
            flat = pc.list_flatten(values)
            parents = pc.list_parent_indices(values)
            per_element = pa.table({"parent": parents, "updated": flat.field(TTL_UPDATED)})
            oldest = per_element.group_by("parent").aggregate([("updated", "min")])
            index = pa.table(
                {
                    "key": keys.take(oldest.column("parent")),
                    "expires": pc.add(oldest.column("updated_min"), ttl),
                }
            )
        self._index[name] = index
        return index

    def forget_index(self) -> None:
        """The state changed behind the index (a restore, an image loaded, a changelog
        applied): rebuild it from the state at the next purge."""
        self._index = dict.fromkeys(self._index)

    def compact(self) -> None:
        """Drop indexes grown well beyond the entries they index (they are rebuilt)."""
        for name, index in self._index.items():
            if index is None:
                continue
            live = self.backend.value_count(self._states[name][1])
            if index.num_rows > _COMPACT_PER_KEY * live + _COMPACT_FLOOR:
                self._index[name] = None

    def take_expired(self) -> int:
        """The entries found expired since the last call."""
        n, self.expired = self.expired, 0
        return n


class TtlValueState(ValueState):
    """The value of the current key, with a TTL (see the module docstring)."""

    def __init__(self, states: TtlStates, descriptor: ValueStateDescriptor, inner: ValueState):
        self._states = states
        self._descriptor = descriptor
        self._inner = inner

    @property
    def descriptor(self) -> ValueStateDescriptor:
        return self._descriptor

    def value(self) -> Any:
        """The current key's value, None if it has none or it expired."""
        stored = self._inner.value()
        if stored is None:
            return None
        name = self._descriptor.name
        now = self._states.now()
        if self._states.is_expired(name, stored[TTL_UPDATED], now):
            self._inner.clear()
            self._states.expired += 1
            return None
        if self._states.refresh_on_read(name):
            self._write(stored["value"], now)
        return stored["value"]

    def exists(self) -> bool:
        return self.value() is not None

    def update(self, value: Any) -> None:
        """Set the current key's value, updated now; None clears it."""
        if value is None:
            self._inner.clear()
            return
        d = self._descriptor
        self._write(
            python_value(value, d.value_type, f"value of state {d.name!r}"), self._states.now()
        )

    def _write(self, value: Any, now: int) -> None:
        self._inner.update({"value": value, TTL_UPDATED: now})
        key = self._states.backend.current_key
        self._states.noted_one(
            self._descriptor.name, key, now + self._states.ttl_ms(self._descriptor.name)
        )

    def clear(self) -> None:
        self._inner.clear()


class TtlListState(ListState):
    """The list of the current key, each element with its own TTL."""

    def __init__(self, states: TtlStates, descriptor: ListStateDescriptor, inner: ListState):
        self._states = states
        self._descriptor = descriptor
        self._inner = inner

    @property
    def descriptor(self) -> ListStateDescriptor:
        return self._descriptor

    def _live(self) -> list[dict[str, Any]]:
        stored = self._inner.get()
        if not stored:
            return []
        name = self._descriptor.name
        now = self._states.now()
        live = [e for e in stored if not self._states.is_expired(name, e[TTL_UPDATED], now)]
        if len(live) < len(stored):
            self._states.expired += len(stored) - len(live)
            self._store(live)
        return live

    def _store(self, elements: list[dict[str, Any]]) -> None:
        self._inner.update(elements)
        if elements:
            key = self._states.backend.current_key
            name = self._descriptor.name
            oldest = min(e[TTL_UPDATED] for e in elements)
            self._states.noted_one(name, key, oldest + self._states.ttl_ms(name))

    def get(self) -> list[Any]:
        """The current key's live elements (empty if none)."""
        live = self._live()
        if live and self._states.refresh_on_read(self._descriptor.name):
            now = self._states.now()
            self._store([{"value": e["value"], TTL_UPDATED: now} for e in live])
        return [e["value"] for e in live]

    def add(self, value: Any) -> None:
        self.add_all([value])

    def add_all(self, values: Iterable[Any]) -> None:
        """Append elements, each updated now."""
        new = self._wrapped(values)
        if new:
            self._store(self._live() + new)

    def update(self, values: Iterable[Any]) -> None:
        """Replace the current key's list, each element updated now; empty clears it."""
        self._store(self._wrapped(values))

    def _wrapped(self, values: Iterable[Any]) -> list[dict[str, Any]]:
        d = self._descriptor
        now = self._states.now()
        out = []
        for v in values:
            if v is None:
                raise StateError(f"list state {d.name!r}: null elements are not allowed")
            value = python_value(v, d.element_type, f"element of state {d.name!r}")
            out.append({"value": value, TTL_UPDATED: now})
        return out

    def clear(self) -> None:
        self._inner.clear()


class TtlMapState(MapState):
    """The map of the current key, each entry with its own TTL."""

    def __init__(self, states: TtlStates, descriptor: MapStateDescriptor, inner: MapState):
        self._states = states
        self._descriptor = descriptor
        self._inner = inner

    @property
    def descriptor(self) -> MapStateDescriptor:
        return self._descriptor

    def _live(self) -> dict[Any, dict[str, Any]]:
        stored = dict(self._inner.items())
        if not stored:
            return {}
        name = self._descriptor.name
        now = self._states.now()
        live = {
            k: v
            for k, v in stored.items()
            if not self._states.is_expired(name, v[TTL_UPDATED], now)
        }
        if len(live) < len(stored):
            self._states.expired += len(stored) - len(live)
            for k in stored.keys() - live.keys():
                self._inner.remove(k)
        return live

    def _put(self, key: Any, value: Any, now: int) -> None:
        self._inner.put(key, {"value": value, TTL_UPDATED: now})
        name = self._descriptor.name
        self._states.noted_one(
            name, self._states.backend.current_key, now + self._states.ttl_ms(name)
        )

    def _refreshed(self, live: dict[Any, dict[str, Any]], keys: Iterable[Any]) -> None:
        if self._states.refresh_on_read(self._descriptor.name):
            now = self._states.now()
            for k in keys:
                self._put(k, live[k]["value"], now)

    def _map_key(self, key: Any) -> Any:
        d = self._descriptor
        if key is None:
            raise StateError(f"map state {d.name!r}: null map keys are not allowed")
        return python_value(key, d.map_key_type, f"map key of state {d.name!r}")

    def get(self, key: Any) -> Any:
        k = self._map_key(key)
        live = self._live()
        if k not in live:
            return None
        self._refreshed(live, [k])
        return live[k]["value"]

    def put(self, key: Any, value: Any) -> None:
        """Set *key*'s value, updated now."""
        d = self._descriptor
        k = self._map_key(key)
        v = None if value is None else python_value(value, d.map_value_type, "map value")
        self._put(k, v, self._states.now())

    def put_all(self, entries: Iterable[tuple[Any, Any]]) -> None:
        for k, v in entries:
            self.put(k, v)

    def contains(self, key: Any) -> bool:
        return self._map_key(key) in self._live()

    def remove(self, key: Any) -> None:
        self._inner.remove(key)

    def items(self) -> list[tuple[Any, Any]]:
        live = self._live()
        self._refreshed(live, list(live))
        return [(k, v["value"]) for k, v in live.items()]

    def keys(self) -> list[Any]:
        return [k for k, _ in self.items()]

    def values(self) -> list[Any]:
        return [v for _, v in self.items()]

    def is_empty(self) -> bool:
        return not self._live()

    def clear(self) -> None:
        self._inner.clear()
