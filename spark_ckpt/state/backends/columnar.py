"""The compact layout of the ``hashmap`` backend: value state of a primitive type under an
integer key, held in numpy columns with a hash index instead of a Python object per key.

:class:`HashIndex` is an open-addressing hash table over int64 keys (linear probing;
Fibonacci hashing, its top bits mapped onto the capacity by a multiply-shift) whose probes
run vectorized: a batch of keys advances one probe step per numpy pass, so a lookup or insert
of *n* keys is O(n) work in C (plus one pass per step of the longest probe, which the load
factor keeps short). Slots are *empty*, *full* or *deleted* (a tombstone, so later probes go
on past it); the table is rebuilt once full and deleted slots reach :data:`_MAX_LOAD` of the
capacity, sized so the live keys fill :data:`_REBUILT_LOAD` of it.

:class:`ColumnarStateTable` keeps, per slot of its index, the key group (int16) and the
value (its fixed-width bytes): 19 bytes per slot for an int64 value, so 27 to 42 per key by
the load factor, with no Python object per key. The per-record API probes in Python (a few
numpy element reads); the vectorized one never loops per key in Python. It holds value
state only, of the types :func:`holds` accepts; every other state of a ``hashmap`` backend
is a :class:`~spark_ckpt.state.backends.heap.HeapStateTable`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from spark_ckpt.state.backends.table import KeyRouting, StateTable, TableStats
from spark_ckpt.state.descriptor import StateDescriptor, StateKind

_EMPTY: Final = 0
_FULL: Final = 1
_DELETED: Final = 2
#: Full and deleted slots past this share of the capacity rebuild the index.
_MAX_LOAD: Final = 0.7
#: A rebuilt index's live keys fill this share of its capacity.
_REBUILT_LOAD: Final = 0.45
_MIN_CAPACITY: Final = 1024
#: 2**64 / golden ratio, odd: Fibonacci hashing's multiplier.
_GOLDEN: Final = np.uint64(0x9E3779B97F4A7C15)
_MASK64: Final = (1 << 64) - 1

Slots = npt.NDArray[np.int64]
_TOP: Final = np.uint64(0xFFFFFFFF00000000)
_LOW: Final = np.uint64(0xFFFFFFFF)


def _signed(key: int) -> int:
    """*key* as the int64 whose bits it has (uint64 keys past 2**63 wrap)."""
    return key - (1 << 64) if key >= 1 << 63 else key


def _integer_key(key_type: pa.DataType) -> bool:
    return bool(pa.types.is_integer(key_type))


def _fixed_value(value_type: pa.DataType) -> bool:
    if pa.types.is_floating(value_type):  # not float16, which Python values do not convert to
        return bool(value_type.bit_width in (32, 64))
    return bool(
        pa.types.is_integer(value_type)
        or (pa.types.is_temporal(value_type) and not pa.types.is_interval(value_type))
    ) and value_type.bit_width in (8, 16, 32, 64)


def holds(descriptor: StateDescriptor, key_type: pa.DataType) -> bool:
    """Whether a :class:`ColumnarStateTable` stores *descriptor* under keys of *key_type*:
    value state of a fixed-width integer, float32/64 or temporal type, integer keys."""
    return (
        descriptor.kind is StateKind.VALUE
        and _integer_key(key_type)
        and _fixed_value(descriptor.column_type)
    )


def _hash_order(
    keys: npt.NDArray[np.int64],
) -> tuple[Slots, npt.NDArray[np.uint64], npt.NDArray[np.bool_] | None]:
    """``(order, top, distinct)``: the positions of *keys* in the order of their Fibonacci
    hashes (a bijection of the key, so equal keys end up next to each other), the top 32
    bits of each hash in that order (what a home slot is computed from), and a mask of
    the last of each run of equal keys (None: the keys are distinct); equal keys keep
    their order. The hash's top half
    and the position are sorted as one uint64 (only ties of the top half are sorted again
    by the whole hash); timsort when the keys come in long runs of hash order, which
    costs about O(n), else a quicksort."""
    hashed = keys.view(np.uint64) * _GOLDEN
    n = len(keys)
    if n >= 1 << 32:  # positions do not fit beside the top half
        order = np.argsort(hashed, kind="stable")
        ordered = hashed[order]
        top = ordered >> np.uint64(32)
        same = ordered[1:] == ordered[:-1]
    else:
        packed = hashed & _TOP
        packed |= np.arange(n, dtype=np.uint64)
        descents = int(np.count_nonzero(packed[1:] < packed[:-1]))
        packed.sort(kind="stable" if descents < n // 64 else "quicksort")
        order = (packed & _LOW).view(np.int64)
        top = packed >> np.uint64(32)
        tie = top[1:] == top[:-1]
        same = np.zeros(max(n - 1, 0), dtype=np.bool_)
        if tie.any():  # keys of one top half: by the whole hash, so equal keys are adjacent
            members = np.flatnonzero(np.r_[tie, False] | np.r_[False, tie])
            sub = order[members]
            order[members] = sub[np.argsort(hashed[sub], kind="stable")]
            ties = np.flatnonzero(tie)
            same[ties] = hashed[order[ties + 1]] == hashed[order[ties]]
    if not same.any():
        return order, top, None
    distinct = np.ones(n, dtype=np.bool_)
    distinct[:-1] = ~same
    return order, top, distinct


class HashIndex:
    """The slots of int64 keys (see the module docstring). Payload columns registered with
    :meth:`payload` move with their slots when the index is rebuilt."""

    def __init__(self, capacity: int = _MIN_CAPACITY) -> None:
        self._alloc(capacity)
        #: the payload columns, one value per slot (:meth:`payload`)
        self.columns: list[npt.NDArray[Any]] = []
        #: live keys
        self.size = 0

    def _alloc(self, capacity: int) -> None:
        self.capacity = capacity
        self._scale = np.uint64(capacity)
        self.keys = np.zeros(capacity, dtype=np.int64)
        self.state = np.zeros(capacity, dtype=np.uint8)
        self.used = 0  # full and deleted slots

    def payload(self, dtype: npt.DTypeLike) -> int:
        """Register a payload column of *dtype*; returns its index in :attr:`columns`."""
        self.columns.append(np.zeros(self.capacity, dtype=dtype))
        return len(self.columns) - 1

    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.state.nbytes + sum(c.nbytes for c in self.columns))

    def _home(self, keys: npt.NDArray[np.int64]) -> Slots:
        top = (keys.view(np.uint64) * _GOLDEN) >> np.uint64(32)
        return ((top * self._scale) >> np.uint64(32)).astype(np.int64)

    def _home_one(self, key: int) -> int:
        return ((((key * 0x9E3779B97F4A7C15) & _MASK64) >> 32) * self.capacity) >> 32

    def _next(self, slots: Slots) -> Slots:
        slots += 1
        slots[slots == self.capacity] = 0
        return slots

    # -- vectorized ---------------------------------------------------------------------------
    def find(self, keys: npt.NDArray[np.int64]) -> Slots:
        """The slot of each key (-1: absent). O(len(keys)) amortized."""
        found = np.full(len(keys), -1, dtype=np.int64)
        if self.size == 0:
            return found
        pending = np.arange(len(keys), dtype=np.int64)
        slot = self._home(keys)
        wanted = keys
        while len(pending):
            st = self.state[slot]
            hit = (st == _FULL) & (self.keys[slot] == wanted)
            found[pending[hit]] = slot[hit]
            go_on = ~hit & (st != _EMPTY)
            pending, slot, wanted = pending[go_on], self._next(slot[go_on]), wanted[go_on]
        return found

    def reserve(self, n: int) -> bool:
        """Rebuild the index now if *n* more keys would overfill it; whether it did (every
        slot found before then is stale)."""
        if self.used + n > _MAX_LOAD * self.capacity:
            self._rebuild(self.size + n)
            return True
        return False

    def insert(self, keys: npt.NDArray[np.int64]) -> Slots:
        """Slots for *keys*, none of which the index holds (the caller checked with
        :meth:`find`); a key repeated in *keys* gets one slot. The index is rebuilt first
        if they would overfill it, which moves every slot: call :meth:`reserve` before
        keeping slots across this call. Into an empty index (a restore, a rebuild) the keys
        are placed in the order of their home slots, sequentially (:meth:`place`)."""
        self.reserve(len(keys))
        placed = np.empty(len(keys), dtype=np.int64)
        if self.used == 0 and len(keys):
            taken, slots = self.place(keys)
            if len(taken) < len(keys):  # repeats: each takes its twin's slot
                return self.find(keys)
            placed[taken] = slots
            return placed
        self._probe_in(keys, np.arange(len(keys), dtype=np.int64), self._home(keys), placed)
        return placed

    def place(self, keys: npt.NDArray[np.int64]) -> tuple[Slots, Slots]:
        """Put *keys* into this index, which must be empty (nothing ever placed since it was
        allocated): ``(taken, slots)``, the positions in *keys* of its distinct keys (a
        repeated key's last occurrence, as a vectorized write keeps) and their slots, so
        that a payload is stored as ``column[slots] = payload[taken]``. Linear probing's
        placement in hash order: each key takes the first slot from its home on past the
        previous key's (a running maximum), so the index is written sequentially; keys that
        run past the last slot go the general way. O(n log n) in C, about O(n) for keys
        already in runs of hash order (a snapshot of this layout, by key group)."""
        assert self.used == 0, "place needs an empty index"
        self.reserve(len(keys))
        order, top, distinct = _hash_order(keys)
        if distinct is not None:
            order, top = order[distinct], top[distinct]
        home = ((top * self._scale) >> np.uint64(32)).view(np.int64)
        step = np.arange(len(order), dtype=np.int64)
        home -= step
        np.maximum.accumulate(home, out=home)
        home += step  # each key's slot: max(its home, the previous key's slot + 1)
        fits = int(np.searchsorted(home, self.capacity))  # slots ascend
        taken, slots = order[:fits], home[:fits]
        self.state[slots] = _FULL
        self.keys[slots] = keys[taken]
        self.used += fits
        self.size += fits
        if fits < len(order):
            past = order[fits:]
            more = np.empty(len(past), dtype=np.int64)
            sub = keys[past]
            self._probe_in(sub, np.arange(len(sub)), np.zeros(len(sub), np.int64), more)
            taken, slots = np.concatenate([taken, past]), np.concatenate([slots, more])
        return taken, slots

    def _probe_in(
        self, keys: npt.NDArray[np.int64], pending: Slots, slot: Slots, placed: Slots
    ) -> None:
        """Place ``keys[pending]``, probing from *slot*, into *placed*: a round per probe
        step. Of the keys probing one free slot, one takes it: each writes its position into
        the slot's (unused) key, and the one whose position stayed there wins; the others
        look at the same slot again, where a key equal to theirs is their twin's."""
        while len(pending):
            wanted = keys[pending]
            full = self.state[slot] == _FULL
            twin = full & (self.keys[slot] == wanted)
            placed[pending[twin]] = slot[twin]
            cand = np.flatnonzero(~full)
            self.keys[slot[cand]] = cand
            won = cand[self.keys[slot[cand]] == cand]
            taken = slot[won]
            self.used += int(np.count_nonzero(self.state[taken] == _EMPTY))
            self.state[taken] = _FULL
            self.keys[taken] = wanted[won]
            placed[pending[won]] = taken
            self.size += len(won)
            advance = full & ~twin
            stay = ~full
            stay[won] = False
            slot = np.where(advance, self._next(slot.copy()), slot)
            pending, slot = pending[advance | stay], slot[advance | stay]

    def remove(self, slots: Slots) -> None:
        """Free *slots* (full, distinct), leaving tombstones."""
        self.state[slots] = _DELETED
        self.size -= len(slots)

    def full(self) -> Slots:
        """Every full slot, ascending."""
        return np.flatnonzero(self.state == _FULL).astype(np.int64)

    def _rebuild(self, live: int) -> None:
        old = self.full()
        keys, columns = self.keys[old], [c[old] for c in self.columns]
        self._alloc(max(_MIN_CAPACITY, int(live / _REBUILT_LOAD)))
        self.columns = [np.zeros(self.capacity, dtype=c.dtype) for c in columns]
        self.size = 0
        taken, slots = self.place(keys)
        for column, moved in zip(self.columns, columns, strict=True):
            column[slots] = moved[taken]

    # -- one key ------------------------------------------------------------------------------
    def insert_one(self, key: int) -> int:
        """The slot for *key*, which the index does not hold (the caller checked with
        :meth:`find_one`); as :meth:`insert`, it may rebuild the index first. O(1)
        expected, probing in Python."""
        self.reserve(1)
        slot = self._home_one(key & _MASK64)
        state, capacity = self.state, self.capacity
        while state[slot] == _FULL:
            slot = slot + 1 if slot + 1 < capacity else 0
        if state[slot] == _EMPTY:
            self.used += 1
        state[slot] = _FULL
        self.keys[slot] = key
        self.size += 1
        return slot

    def find_one(self, key: int) -> int:
        """The slot of *key* (-1: absent). O(1) expected, probing in Python."""
        slot = self._home_one(key & _MASK64)
        state, keys, capacity = self.state, self.keys, self.capacity
        while True:
            st = state[slot]
            if st == _EMPTY:
                return -1
            if st == _FULL and keys[slot] == key:
                return slot
            slot = slot + 1 if slot + 1 < capacity else 0


def _value_dtype(value_type: pa.DataType) -> tuple[np.dtype[Any], bool]:
    """The numpy dtype of a value column's bytes, and whether numpy's ``item()`` gives the
    Python value Arrow's ``as_py`` would (integers and floats; not temporal types)."""
    width = value_type.bit_width // 8
    if pa.types.is_floating(value_type):
        return np.dtype(f"f{width}"), True
    if pa.types.is_unsigned_integer(value_type):
        return np.dtype(f"u{width}"), True
    return np.dtype(f"i{width}"), bool(pa.types.is_integer(value_type))


class ColumnarStateTable(StateTable):
    """Value state in numpy columns under a :class:`HashIndex` (see the module docstring)."""

    def __init__(self, descriptor: StateDescriptor, key_type: pa.DataType) -> None:
        super().__init__(descriptor)
        self.key_type = key_type
        self.index = HashIndex()
        self._dtype, self._plain = _value_dtype(descriptor.column_type)
        self._kg = self.index.payload(np.int16)
        self._value = self.index.payload(self._dtype)

    # -- conversions ----------------------------------------------------------------------------
    def _keys(self, keys: pa.Array) -> npt.NDArray[np.int64]:
        arr: npt.NDArray[Any] = keys.to_numpy(zero_copy_only=False)
        if arr.dtype == np.uint64:
            return arr.view(np.int64)
        return arr.astype(np.int64, copy=False)

    def _key_column(self, keys: npt.NDArray[np.int64]) -> pa.Array:
        if pa.types.is_uint64(self.key_type):
            return pa.array(keys.view(np.uint64), type=self.key_type)
        return pa.array(keys).cast(self.key_type)

    def _values(self, values: pa.Array) -> npt.NDArray[Any]:
        buffer = values.buffers()[1]
        arr = np.frombuffer(buffer, dtype=self._dtype, count=len(values) + values.offset)
        return arr[values.offset :]

    def _column(self, slots: Slots) -> pa.Array:
        """The values of *slots* (-1: null) as a column."""
        present = slots >= 0
        values = self.index.columns[self._value][np.where(present, slots, 0)]
        if present.all():
            return pa.Array.from_buffers(
                self.descriptor.column_type, len(values), [None, pa.py_buffer(values)]
            )
        validity = pa.array(present).buffers()[1]
        return pa.Array.from_buffers(
            self.descriptor.column_type,
            len(values),
            [validity, pa.py_buffer(values)],
            null_count=int(len(present) - np.count_nonzero(present)),
        )

    def _one(self, slot: int) -> Any:
        if self._plain:
            return self.index.columns[self._value][slot].item()
        value = self.index.columns[self._value][slot : slot + 1]
        return pa.Array.from_buffers(self.descriptor.column_type, 1, [None, pa.py_buffer(value)])[
            0
        ].as_py()

    # -- per record ---------------------------------------------------------------------------
    def lookup(self, key_group: int, key: Any) -> Any:
        slot = self.index.find_one(_signed(int(key)))
        return None if slot < 0 else self._one(slot)

    def store(self, key_group: int, key: Any, value: Any) -> None:
        signed = _signed(int(key))
        slot = self.index.find_one(signed)
        if slot < 0:
            slot = self.index.insert_one(signed)
            self.index.columns[self._kg][slot] = key_group
        if self._plain:  # numpy converts the (checked) Python number itself
            self.index.columns[self._value][slot] = value
        else:
            raw = self._values(pa.array([value], type=self.descriptor.column_type))
            self.index.columns[self._value][slot] = raw[0]

    def remove(self, key_group: int, key: Any) -> None:
        slot = self.index.find_one(_signed(int(key)))
        if slot >= 0:
            self.index.remove(np.array([slot], dtype=np.int64))

    # -- vectorized -----------------------------------------------------------------------------
    def _upsert(
        self, keys: npt.NDArray[np.int64], kgs: npt.NDArray[np.int16], values: npt.NDArray[Any]
    ) -> None:
        if self.index.used == 0:  # into an empty index (a restore): payloads gathered
            taken, at = self.index.place(keys)
            self.index.columns[self._kg][at] = kgs[taken]
            self.index.columns[self._value][at] = values[taken]
            return
        slots = self.index.find(keys)
        new = slots < 0
        if new.any():
            if self.index.reserve(int(np.count_nonzero(new))):
                slots = self.index.find(keys)  # the rebuild moved them; *new* still holds
            slots[new] = self.index.insert(keys[new])
            self.index.columns[self._kg][slots[new]] = kgs[new]
        self.index.columns[self._value][slots] = values

    def _drop(self, keys: npt.NDArray[np.int64]) -> None:
        slots = self.index.find(keys)
        self.index.remove(np.unique(slots[slots >= 0]))

    def read(self, routing: KeyRouting) -> pa.Array:
        return self._column(self.index.find(self._keys(routing.sorted_array)))

    def write(self, routing: KeyRouting, values: pa.Array) -> None:
        keys = self._keys(routing.sorted_array)
        kgs = routing.sorted_groups.astype(np.int16)
        if values.null_count:
            valid = values.is_valid().to_numpy(zero_copy_only=False)
            self._drop(keys[~valid])
            keys, kgs, values = keys[valid], kgs[valid], values.filter(pa.array(valid))
        self._upsert(keys, kgs, self._values(values))

    def delete(self, routing: KeyRouting) -> None:
        self._drop(self._keys(routing.sorted_array))

    def read_python(self, routing: KeyRouting) -> list[Any]:
        found: list[Any] = self.read(routing).to_pylist()
        return found

    def write_python(self, routing: KeyRouting, entries: list[Any]) -> None:
        self.write(routing, self.column(entries))

    # -- snapshots and restores -----------------------------------------------------------------
    def entries(self) -> tuple[npt.NDArray[np.int64], pa.Array, pa.Array]:
        slots = self.index.full()
        kgs = self.index.columns[self._kg][slots]
        order = np.argsort(kgs, kind="stable")
        slots = slots[order]
        keys = self._key_column(self.index.keys[slots])
        return kgs[order].astype(np.int64), keys, self._column(slots)

    def current(self, groups: list[int], keys: list[list[Any]]) -> tuple[pa.Array, list[bool]]:
        flat = [k for segment in keys for k in segment]
        slots = self.index.find(self._keys(pa.array(flat, type=self.key_type)))
        member: list[bool] = (slots >= 0).tolist()
        return self._column(slots), member

    def load(
        self,
        key_groups: npt.NDArray[np.int64],
        keys: pa.Array,
        values: pa.Array,
        deleted: npt.NDArray[np.bool_] | None,
    ) -> None:
        """As :meth:`StateTable.load`; a blob's keys are unique (every writer makes them
        so), and a key repeated in one call would keep one of its rows, not a chosen one."""
        k = self._keys(keys)
        live = values.is_valid().to_numpy(zero_copy_only=False)
        if deleted is not None:
            self._drop(k[deleted])
            live &= ~deleted
        if not live.all():
            k, key_groups, values = k[live], key_groups[live], values.filter(pa.array(live))
        self._upsert(k, key_groups.astype(np.int16), self._values(values))

    def migrate(
        self, migration: Callable[[pa.Array], pa.Array], descriptor: StateDescriptor
    ) -> None:
        """Rewrite the values with *migration*; *descriptor* must be one :func:`holds`
        (the storage rebuilds the table in the other layout otherwise)."""
        slots = self.index.full()
        migrated = migration(self._column(slots))
        if migrated.null_count:
            self.index.remove(slots[~migrated.is_valid().to_numpy(zero_copy_only=False)])
        self.descriptor = descriptor
        self._dtype, self._plain = _value_dtype(descriptor.column_type)
        self.index.columns[self._value] = np.zeros(self.index.capacity, dtype=self._dtype)
        valid = migrated.is_valid().to_numpy(zero_copy_only=False)
        self.index.columns[self._value][slots[valid]] = self._values(
            migrated.filter(pa.array(valid))
        )

    def count(self) -> int:
        return self.index.size

    def is_empty(self) -> bool:
        return self.index.size == 0

    def stats(self) -> TableStats:
        return TableStats(self.index.size, self.index.nbytes(), 0)
