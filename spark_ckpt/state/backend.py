"""The keyed and operator state of one operator subtask: registration, per-record and
vectorized access.

A :class:`KeyedStateBackend` holds the state of one subtask of one operator: *keyed state*
(value, list and map state per key, for the keys of the subtask's
:class:`~spark_ckpt.state.keygroup.KeyGroupRange`) and *operator state*
(:class:`~spark_ckpt.state.operator_state.OperatorListState`). It lives on the task thread:
it is not thread-safe, and every call (record processing, ``snapshot``, notifications,
restore) comes from that thread. Only the tables a snapshot returns travel to other threads,
and those are immutable. Operators do not see the backend: they receive a
:class:`~spark_ckpt.state.context.StateContext` on it.

Representation. Each keyed state (:class:`KeyedStateTable`) keeps, per key group, a Python
``dict`` from key to the stored form of its value, which the state's value store
(:mod:`spark_ckpt.state.value_store`) chooses: the Python object Arrow's ``to_pylist`` yields
(lists for list state, dicts for map state), or, for value state of a nested type, a slot in
an arena of Arrow arrays, so a list of structs is never turned into Python objects on the
vectorized path. The per-record API is a dict access; the vectorized API
(:meth:`KeyedStateBackend.get_values` / :meth:`~KeyedStateBackend.put_values`) hashes a whole
Arrow key array at once (:mod:`spark_ckpt.state.keygroup`), radix-sorts it by key group and
does one C-level ``map(dict.get)`` / ``dict.update`` per key group — no per-row Python loop
(except for the rare null values that clear keys). Every mutation is also recorded for the
next incremental snapshot (:class:`~spark_ckpt.state.snapshot.changes.StateChanges`): the
vectorized API appends its Arrow input to a change log (O(1) per call), the per-record API
records the key.

Snapshots are the job of the backend's snapshot strategy,
:attr:`KeyedStateBackend.snapshots` (a
:class:`~spark_ckpt.state.snapshot.strategy.SnapshotStrategy` over the backend's states: full
and incremental snapshots, checkpoint notifications, the incremental base), which the task
calls directly; a fresh backend is loaded from a checkpoint by
:func:`spark_ckpt.state.state_restore.restore_backend` (any parallelism). Descriptors and
blob schemas: :mod:`spark_ckpt.state.descriptor`.

Restored state and schema evolution. A state loaded by a restore under a descriptor no
operator registered yet is *unclaimed* (:meth:`KeyedStateBackend.unclaimed_states`). The first
registration claims it: with the stored descriptor as is, with a changed but compatible
descriptor after migrating the loaded values to it (vectorized, one Arrow column per state:
:mod:`spark_ckpt.state.schema_evolution`), and StateError naming the operator, the state and
the field for an incompatible change. Once claimed (or registered before the restore, which
migrates the stored blobs instead), a state's descriptor is fixed: registering other types
is an error.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import compress, repeat
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import StateError
from spark_ckpt.protocol.state_handles import TaskId
from spark_ckpt.state.descriptor import (
    CONVERSION_ERRORS,
    ListStateDescriptor,
    MapStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
    check_arrow_type,
    check_state_name,
    to_column,
)
from spark_ckpt.state.keyed_table import KeyedStateTable
from spark_ckpt.state.keygroup import (
    DEFAULT_MAX_PARALLELISM,
    KeyGroupRange,
    check_max_parallelism,
    is_supported_key_type,
    key_group_indices,
    range_for_subtask,
)
from spark_ckpt.state.operator_state import OperatorListState
from spark_ckpt.state.schema_evolution import (
    Migration,
    descriptor_migration,
    plan_migration,
    state_label,
)
from spark_ckpt.state.snapshot.strategy import SnapshotStrategy
from spark_ckpt.state.snapshot.tables import full_table
from spark_ckpt.state.views import ArrayLike, ListState, MapState, ValueState


@dataclass(frozen=True)
class _Routing:
    """A key array sorted by key group: the keys of ``groups[j]`` are
    ``sorted_keys[bounds[j]:bounds[j + 1]]``; ``order[s]`` is the input position of sorted
    position ``s``."""

    source: object
    array: pa.Array
    key_groups: npt.NDArray[np.integer]
    groups: list[int]
    bounds: list[int]
    sorted_keys: list[Any]
    order: npt.NDArray[np.int64]

    def segments(self) -> Iterator[tuple[int, int, int]]:
        """(key group, begin, end) of each run of the sorted keys."""
        return zip(self.groups, self.bounds[:-1], self.bounds[1:], strict=True)

    def inverse(self) -> npt.NDArray[np.int64]:
        """Per input position, its position among the sorted keys."""
        inverse = np.empty_like(self.order)
        inverse[self.order] = np.arange(len(self.order), dtype=np.int64)
        return inverse


class KeyedStateBackend:
    """Keyed and operator state of subtask *subtask* of operator *operator_uid*, owning the
    key groups *key_group_range* (inclusive ends) of *max_parallelism*. See the module
    docstring for the representation and the threading contract; snapshots are taken by its
    strategy (:attr:`snapshots`), restores made by
    :func:`~spark_ckpt.state.state_restore.restore_backend`. Held by the task; operators get a
    :class:`~spark_ckpt.state.context.StateContext` on it.

    *parallelism* (optional) is only needed to redistribute operator state on restore; when
    given, *key_group_range* must be the range Flink assigns to *subtask* at it.
    """

    def __init__(
        self,
        operator_uid: str,
        subtask: int,
        key_type: pa.DataType,
        key_group_range: KeyGroupRange,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        *,
        parallelism: int | None = None,
    ) -> None:
        check_max_parallelism(max_parallelism)
        if not isinstance(key_type, pa.DataType) or not is_supported_key_type(key_type):
            raise StateError(
                f"key type {key_type} is not supported: use an integer, bool, string or binary key"
            )
        if key_group_range.end >= max_parallelism:
            raise StateError(
                f"key group range {key_group_range} exceeds max_parallelism {max_parallelism}"
            )
        if parallelism is not None:
            expected = range_for_subtask(max_parallelism, parallelism, subtask)
            if expected != key_group_range:
                raise StateError(
                    f"subtask {subtask} of {parallelism} owns key groups {expected}, "
                    f"not {key_group_range}"
                )
        self.operator_uid = operator_uid
        self.subtask = subtask
        self.key_type = key_type
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self.parallelism = parallelism
        self._states: dict[str, KeyedStateTable] = {}
        self._operator_states: dict[str, OperatorListState] = {}
        # restored states no registration has claimed yet (see the module docstring)
        self._unclaimed: set[str] = set()
        self._unclaimed_operator: set[str] = set()
        self._current_key: Any = None
        self._current_group = -1
        self._has_current = False
        self._route_cache: _Routing | None = None
        #: the snapshots of this backend's states (full and incremental), the checkpoint
        #: notifications and the incremental base: the task's business, not the operators'
        self.snapshots: Final = SnapshotStrategy(
            self.task_id,
            key_type,
            key_group_range,
            max_parallelism,
            self._states,
            self._operator_states,
        )

    @classmethod
    def for_subtask(
        cls,
        operator_uid: str,
        subtask: int,
        parallelism: int,
        key_type: pa.DataType,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    ) -> KeyedStateBackend:
        """The backend of subtask *subtask* of *parallelism*, with Flink's key group range."""
        rng = range_for_subtask(max_parallelism, parallelism, subtask)
        return cls(operator_uid, subtask, key_type, rng, max_parallelism, parallelism=parallelism)

    @property
    def task_id(self) -> TaskId:
        return TaskId(self.operator_uid, self.subtask)

    def __repr__(self) -> str:
        return (
            f"KeyedStateBackend({self.operator_uid!r}, subtask={self.subtask}, "
            f"key_groups={self.key_group_range}, states={sorted(self._states)})"
        )

    # -- registration ----------------------------------------------------------------------
    def register(self, descriptor: StateDescriptor) -> KeyedStateTable:
        """The storage of keyed state *descriptor*, registered on first use. A restored,
        unclaimed state of that name is claimed: migrated to *descriptor* if its stored
        descriptor differs (:mod:`~spark_ckpt.state.schema_evolution`; StateError naming
        the field if incompatible). StateError if the name is taken by operator state or by
        a claimed descriptor of other types. (The state package's own entry point; operators
        use the typed views.)"""
        if not isinstance(
            descriptor, ValueStateDescriptor | ListStateDescriptor | MapStateDescriptor
        ):
            raise StateError(f"not a state descriptor: {descriptor!r}")
        if descriptor.ttl is not None:  # the context stores it under its storage descriptor
            raise StateError(f"state {descriptor.name!r} has a TTL: use it through StateContext")
        name = descriptor.name
        state = self._states.get(name)
        if state is None:
            if name in self._operator_states:
                raise StateError(f"state {name!r} is already operator state")
            state = self._states[name] = KeyedStateTable(descriptor)
        elif state.descriptor != descriptor:
            if name not in self._unclaimed:
                raise StateError(
                    f"state {name!r} is registered as {state.descriptor}, not {descriptor}"
                )
            migration = descriptor_migration(state.descriptor, descriptor, self.operator_uid)
            self._migrate_loaded(state, migration, descriptor)
        self._unclaimed.discard(name)
        return state

    def restored_state(self, stored: StateDescriptor) -> tuple[KeyedStateTable, Migration]:
        """For restore: the storage that rows of keyed state written with descriptor
        *stored* go to, and the migration of their value column. A state registered before
        the restore keeps its descriptor (the stored column is migrated to it, or
        StateError); a new one is registered as *stored*, unclaimed. A state loaded
        unclaimed from a blob of another type (a chain written across an evolution) moves to
        whichever of the two types the other migrates to."""
        name = stored.name
        state = self._states.get(name)
        if state is None:
            if name in self._operator_states:
                raise StateError(
                    f"{state_label(name, self.operator_uid)}: changed from {stored.kind.value} "
                    "state to operator list state: incompatible"
                )
            state = self._states[name] = KeyedStateTable(stored)
            self._unclaimed.add(name)
        elif state.descriptor != stored and name in self._unclaimed:
            try:
                forward = descriptor_migration(state.descriptor, stored, self.operator_uid)
            except StateError:
                pass  # the other direction, below
            else:
                self._migrate_loaded(state, forward, stored)
        return state, descriptor_migration(stored, state.descriptor, self.operator_uid)

    @staticmethod
    def _migrate_loaded(
        state: KeyedStateTable, migration: Migration, descriptor: StateDescriptor
    ) -> None:
        """Rewrite the values *state* holds with *migration* (one Arrow column for all key
        groups) and make *descriptor* its descriptor."""
        if migration.is_identity:
            state.descriptor = descriptor
        else:
            state.migrate(migration, descriptor)

    def unclaimed_states(self) -> list[str]:
        """Names of restored states (keyed and operator) no registration has claimed yet."""
        return sorted(self._unclaimed | self._unclaimed_operator)

    def registered_states(self) -> tuple[list[str], list[str]]:
        """Names of the claimed keyed states and claimed operator states (registered by the
        operator, before or after a restore)."""
        return (
            sorted(set(self._states) - self._unclaimed),
            sorted(set(self._operator_states) - self._unclaimed_operator),
        )

    def value_state(self, descriptor: ValueStateDescriptor) -> ValueState:
        """The per-record view of value state *descriptor* (registered on first use)."""
        self._expect(descriptor, ValueStateDescriptor)
        return ValueState(self._current, self.register(descriptor))

    def list_state(self, descriptor: ListStateDescriptor) -> ListState:
        """The per-record view of list state *descriptor* (registered on first use)."""
        self._expect(descriptor, ListStateDescriptor)
        return ListState(self._current, self.register(descriptor))

    def map_state(self, descriptor: MapStateDescriptor) -> MapState:
        """The per-record view of map state *descriptor* (registered on first use)."""
        self._expect(descriptor, MapStateDescriptor)
        return MapState(self._current, self.register(descriptor))

    @staticmethod
    def _expect(descriptor: object, cls: type) -> None:
        if not isinstance(descriptor, cls):
            raise StateError(f"expected a {cls.__name__}, got {descriptor!r}")

    def operator_list_state(self, name: str, element_type: pa.DataType) -> OperatorListState:
        """Operator list state *name* (registered on first use). A restored, unclaimed
        operator state of that name is claimed, its elements migrated to *element_type* if
        they were stored as another type (StateError if incompatible)."""
        check_state_name(name)
        check_arrow_type("element_type", element_type)
        state = self._operator_states.get(name)
        if state is None:
            if name in self._states:
                raise StateError(f"state {name!r} is already keyed state")
            state = self._operator_states[name] = OperatorListState(name, element_type)
        elif state.element_type != element_type:
            if name not in self._unclaimed_operator:
                raise StateError(
                    f"operator state {name!r} holds {state.element_type}, not {element_type}"
                )
            migration = plan_migration(
                state.element_type,
                element_type,
                state=name,
                operator_uid=self.operator_uid,
                operator_state=True,
            )
            migrated = migration(pa.array(state.get(), type=state.element_type))
            state = self._operator_states[name] = OperatorListState(name, element_type)
            state.update(migrated.to_pylist())
        self._unclaimed_operator.discard(name)
        return state

    def restored_operator_state(self, name: str, element_type: pa.DataType) -> OperatorListState:
        """For restore: operator list state *name* to load elements of *element_type* into
        (already migrated by the caller to the registered type, if any): the registered
        state, or a new unclaimed one."""
        state = self._operator_states.get(name)
        if state is None:
            if name in self._states:
                raise StateError(
                    f"{state_label(name, self.operator_uid)}: changed from operator list state "
                    f"to {self._states[name].descriptor.kind.value} state: incompatible"
                )
            state = self._operator_states[name] = OperatorListState(name, element_type)
            self._unclaimed_operator.add(name)
        elif state.element_type != element_type:
            raise StateError(
                f"operator state {name!r} holds {state.element_type}, not {element_type}"
            )
        return state

    def operator_state_types(self) -> dict[str, pa.DataType]:
        """Element type of every operator list state, by name."""
        return {n: s.element_type for n, s in self._operator_states.items()}

    @property
    def tables(self) -> Mapping[str, KeyedStateTable]:
        """The storage of every keyed state, registered or restored, by name (live: a state
        registered later appears in it)."""
        return self._states

    def descriptors(self) -> list[StateDescriptor]:
        """Every keyed state, registered or restored, by name."""
        return [self._states[n].descriptor for n in sorted(self._states)]

    # -- current key -----------------------------------------------------------------------
    def set_current_key(self, key: Any) -> None:
        """Make *key* the key the per-record state views act on. Raises
        :class:`StateError` if it is null, not of the key type, or outside this subtask's
        key groups."""
        if key is None:
            raise StateError("the current key must not be null")
        try:
            arr = pa.array([key], type=self.key_type)
        except CONVERSION_ERRORS as e:
            raise StateError(f"key {key!r} is not a valid {self.key_type}") from e
        kg = int(key_group_indices(arr, self.max_parallelism)[0])
        if kg not in self.key_group_range:
            raise StateError(
                f"key {key!r} is in key group {kg}, outside {self.key_group_range} of "
                f"subtask {self.task_id}"
            )
        self._current_key = arr[0].as_py()
        self._current_group = kg
        self._has_current = True

    @property
    def current_key(self) -> Any:
        if not self._has_current:
            raise StateError("no current key: call set_current_key first")
        return self._current_key

    def _current(self) -> tuple[int, Any]:
        if not self._has_current:
            raise StateError("keyed state accessed without a current key")
        return self._current_group, self._current_key

    # -- vectorized access -----------------------------------------------------------------
    def _key_array(self, keys: ArrayLike) -> pa.Array:
        try:
            if isinstance(keys, pa.ChunkedArray):
                arr = keys.combine_chunks()
            elif isinstance(keys, pa.Array):
                arr = keys
            else:
                arr = pa.array(keys, type=self.key_type)
            if pa.types.is_dictionary(arr.type):
                arr = arr.dictionary_decode()
            if arr.type != self.key_type:
                arr = arr.cast(self.key_type)
        except CONVERSION_ERRORS as e:
            raise StateError(f"keys are not {self.key_type}: {e}") from e
        return arr

    def _route(self, keys: ArrayLike) -> _Routing:
        """Hash, range-check and sort *keys* by key group. The last routing of an Arrow
        array is cached by identity (arrays are immutable), so ``put_values`` right after
        ``get_values`` on the same batch does not hash again."""
        cached = self._route_cache
        if cached is not None and cached.source is keys:
            return cached
        arr = self._key_array(keys)
        kgs = key_group_indices(arr, self.max_parallelism)
        if not self.key_group_range.contains_all(kgs):
            outside = int(
                np.count_nonzero(
                    (kgs < self.key_group_range.start) | (kgs > self.key_group_range.end)
                )
            )
            raise StateError(
                f"{outside} key(s) outside key groups {self.key_group_range} of subtask "
                f"{self.task_id}"
            )
        # key groups < 2**15 fit int16, for which numpy's stable sort is a radix sort
        order = np.argsort(kgs.astype(np.int16), kind="stable").astype(np.int64)
        sorted_kgs = kgs[order]
        starts = np.flatnonzero(np.diff(sorted_kgs)) + 1 if len(order) else np.empty(0, np.int64)
        bounds = [0, *starts.tolist(), len(order)] if len(order) else [0]
        groups = sorted_kgs[bounds[:-1]].tolist() if len(order) else []
        sorted_keys = arr.take(pa.array(order)).to_pylist()
        routing = _Routing(keys, arr, kgs, groups, bounds, sorted_keys, order)
        if isinstance(keys, pa.Array | pa.ChunkedArray):
            self._route_cache = routing
        return routing

    def _value_state(self, descriptor: ValueStateDescriptor) -> KeyedStateTable:
        self._expect(descriptor, ValueStateDescriptor)
        return self.register(descriptor)

    def get_values(self, descriptor: ValueStateDescriptor, keys: ArrayLike) -> pa.Array:
        """The value of each key (null where it has none), aligned with *keys*, as an array
        of ``descriptor.value_type``. Keys may repeat; all must be in this subtask's key
        groups."""
        state = self._value_state(descriptor)
        routing = self._route(keys)
        out: list[Any] = []
        for kg, begin, end in routing.segments():
            group = state.groups.get(kg)
            segment = routing.sorted_keys[begin:end]
            if group:
                out.extend(map(group.get, segment))
            else:
                out.extend([None] * len(segment))
        return state.column(list(map(out.__getitem__, routing.inverse().tolist())))

    def put_values(
        self, descriptor: ValueStateDescriptor, keys: ArrayLike, values: ArrayLike
    ) -> None:
        """Set the value of each key; a null value clears the key. *keys* are meant to be
        unique; if a key repeats, its last occurrence (in input order) wins. Nothing changes
        if any key is invalid or outside this subtask's key groups."""
        state = self._value_state(descriptor)
        routing = self._route(keys)
        vals = self._value_array(descriptor, values)
        if len(vals) != len(routing.array):
            raise StateError(f"{len(routing.array)} keys but {len(vals)} values")
        stored = state.stored_many(vals, routing.order)
        clears = vals.null_count > 0
        if clears and pc.count_distinct(routing.array).as_py() < len(routing.array):
            # a key repeats: an order-preserving loop keeps "last occurrence wins"
            for kg, begin, end in routing.segments():
                group = state.group(kg)
                for k, v in zip(routing.sorted_keys[begin:end], stored[begin:end], strict=True):
                    if v is None:
                        group.pop(k, None)
                    else:
                        group[k] = v
        else:
            valid = (
                vals.is_valid().to_numpy(zero_copy_only=False)[routing.order] if clears else None
            )
            keep = None if valid is None else valid.tolist()
            drop = None if valid is None else (~valid).tolist()
            for kg, begin, end in routing.segments():
                segment = routing.sorted_keys[begin:end]
                group = state.group(kg)
                if keep is None or drop is None:
                    group.update(zip(segment, stored[begin:end], strict=True))
                    continue
                mask = keep[begin:end]
                group.update(
                    zip(compress(segment, mask), compress(stored[begin:end], mask), strict=True)
                )
                gone = compress(segment, drop[begin:end])
                deque(map(group.pop, gone, repeat(None)), maxlen=0)
        state.log(routing.key_groups, routing.array, vals)
        state.compact()

    def clear_values(self, descriptor: StateDescriptor, keys: ArrayLike) -> None:
        """Remove the entries of *keys* from any keyed state."""
        state = self.register(descriptor)
        routing = self._route(keys)
        for kg, begin, end in routing.segments():
            segment = routing.sorted_keys[begin:end]
            group = state.groups.get(kg)
            if group:
                deque(map(group.pop, segment, repeat(None)), maxlen=0)
        state.log(
            routing.key_groups,
            routing.array,
            pa.nulls(len(routing.array), state.descriptor.column_type),
        )
        state.compact()

    def get_entries(self, descriptor: StateDescriptor, keys: ArrayLike) -> list[Any]:
        """The entry of each key of any keyed state as a Python value (a list for list
        state, a dict for map state; None where it has none), aligned with *keys*. The
        objects may be the stored ones: replace them with :meth:`put_entries`, never mutate
        them. O(keys), per key in Python."""
        state = self.register(descriptor)
        routing = self._route(keys)
        found: list[Any] = [None] * len(routing.array)
        for kg, begin, end in routing.segments():
            group = state.groups.get(kg)
            if group:
                for i in range(begin, end):
                    found[routing.order[i]] = state.lookup(kg, routing.sorted_keys[i])
        return found

    def put_entries(self, descriptor: StateDescriptor, keys: ArrayLike, entries: list[Any]) -> None:
        """Replace the entry of each key of any keyed state (the Python values
        :meth:`get_entries` returns; None, an empty list or an empty map clears it), keys
        unique. O(keys), per key in Python."""
        state = self.register(descriptor)
        routing = self._route(keys)
        if len(entries) != len(routing.array):
            raise StateError(f"{len(routing.array)} keys but {len(entries)} entries")
        kept = [e if e else None for e in entries]
        for kg, begin, end in routing.segments():
            group = state.group(kg)
            for i in range(begin, end):
                entry, key = kept[routing.order[i]], routing.sorted_keys[i]
                if entry is None:
                    group.pop(key, None)
                else:
                    group[key] = state.values.stored(entry)
        values = pa.array(to_column(state.descriptor.kind, kept), state.descriptor.column_type)
        state.log(routing.key_groups, routing.array, values)
        state.compact()

    def _value_array(self, descriptor: ValueStateDescriptor, values: ArrayLike) -> pa.Array:
        try:
            if isinstance(values, pa.ChunkedArray):
                arr = values.combine_chunks()
            elif isinstance(values, pa.Array):
                arr = values
            else:
                arr = pa.array(values, type=descriptor.value_type)
            if arr.type != descriptor.value_type:
                arr = arr.cast(descriptor.value_type)
        except CONVERSION_ERRORS as e:
            raise StateError(f"values are not {descriptor.value_type}: {e}") from e
        return arr

    # -- inspection ------------------------------------------------------------------------
    def _state(self, descriptor: StateDescriptor | str) -> KeyedStateTable:
        if isinstance(descriptor, str):
            state = self._states.get(descriptor)
            if state is None:
                raise StateError(f"no keyed state {descriptor!r}")
            return state
        return self.register(descriptor)

    def keys(self, descriptor: StateDescriptor | str) -> pa.Array:
        """Every key with an entry in the state, in key group order."""
        state = self._state(descriptor)
        out: list[Any] = []
        for kg in sorted(state.groups):
            out.extend(state.groups[kg])
        return pa.array(out, type=self.key_type)

    def to_table(self, descriptor: StateDescriptor | str) -> pa.Table:
        """Every (key group, key, value) of the state, in key group order, with the FULL
        blob schema."""
        return full_table(self._state(descriptor), self.key_type, self.max_parallelism)

    def value_count(self, descriptor: StateDescriptor | str | None = None) -> int:
        """Number of (key, state) entries, of one state or of all keyed states."""
        if descriptor is None:
            return sum(s.count() for s in self._states.values())
        return self._state(descriptor).count()

    def holds_state(self) -> bool:
        """Whether any keyed state has an entry or any operator state an element."""
        return bool(self.value_count()) or any(op.get() for op in self._operator_states.values())
