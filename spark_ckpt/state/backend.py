"""The keyed and operator state of one operator subtask: registration, per-record and
vectorized access.

A :class:`KeyedStateBackend` holds the keyed state of one subtask of one operator (value, list
and map state per key, for the keys of the subtask's
:class:`~spark_ckpt.state.keygroup.KeyGroupRange`), and gives access to the subtask's
operator state (:class:`~spark_ckpt.state.operator_backend.OperatorStateBackend`). It
lives on the task thread: it is not thread-safe, and every call (record processing,
``snapshot``, notifications, restore) comes from that thread. Only the tables a snapshot
returns travel to other threads, and those are immutable. Operators do not see the backend:
they receive a
:class:`~spark_ckpt.state.context.StateContext` on it.

Storage. The backend validates and routes keys (hashed, range-checked and sorted by key
group once per batch: :class:`~spark_ckpt.state.backends.table.KeyRouting`) and hands whole
batches to the storage of each state, a
:class:`~spark_ckpt.state.backends.table.StateTable` made by the backend's
:class:`~spark_ckpt.state.backends.table.StateStorage`: ``hashmap`` (Python dicts in the
host's memory, :mod:`spark_ckpt.state.backends.heap`) or ``rocksdb`` (an embedded RocksDB on
the executor's local disk, :mod:`spark_ckpt.state.backends.rocksdb`), chosen by
``state.backend.type`` (:mod:`spark_ckpt.state.backends.spec`). Operators cannot tell them
apart, and a checkpoint's format does not depend on them. Every mutation is also recorded
for the next incremental snapshot (:class:`~spark_ckpt.state.snapshot.changes.StateChanges`):
the vectorized API appends its Arrow input to a change log (O(1) per call), the per-record
API records the key. Operator state lives beside, in an
:class:`~spark_ckpt.state.operator_backend.OperatorStateBackend`
(:attr:`KeyedStateBackend.operator`).

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

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import StateError
from spark_ckpt.protocol.state_handles import StorageMetrics, TaskId
from spark_ckpt.state.backends.heap import HeapStorage
from spark_ckpt.state.backends.table import KeyRouting, StateStorage, StateTable
from spark_ckpt.state.descriptor import (
    CONVERSION_ERRORS,
    ListStateDescriptor,
    MapStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from spark_ckpt.state.keygroup import (
    DEFAULT_MAX_PARALLELISM,
    KeyGroupRange,
    check_max_parallelism,
    is_supported_key_type,
    key_group_indices,
    range_for_subtask,
)
from spark_ckpt.state.operator_backend import OperatorStateBackend
from spark_ckpt.state.operator_state import OperatorListState
from spark_ckpt.state.schema_evolution import Migration, descriptor_migration, state_label
from spark_ckpt.state.snapshot.changes import last_occurrences
from spark_ckpt.state.snapshot.strategy import SnapshotStrategy
from spark_ckpt.state.snapshot.tables import full_table
from spark_ckpt.state.views import ArrayLike, ListState, MapState, ValueState


def default_storage(operator_uid: str, subtask: int, key_type: pa.DataType) -> StateStorage:
    """The storage of a backend built without one: ``hashmap``."""
    return HeapStorage(key_type)


class KeyedStateBackend:
    """Keyed state of subtask *subtask* of operator *operator_uid*, owning the key groups
    *key_group_range* (inclusive ends) of *max_parallelism*, stored by *storage* (default:
    ``hashmap``, in memory). See the module docstring for the representation and the
    threading contract; snapshots are taken by its strategy (:attr:`snapshots`), restores
    made by :func:`~spark_ckpt.state.state_restore.restore_backend`. Held by the task;
    operators get a :class:`~spark_ckpt.state.context.StateContext` on it. :meth:`close`
    releases the storage (local files of ``rocksdb``) once the task is done with it.

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
        storage: StateStorage | None = None,
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
        #: where the keyed states' entries are stored (``hashmap`` or ``rocksdb``)
        self.storage: Final[StateStorage] = (
            default_storage(operator_uid, subtask, key_type) if storage is None else storage
        )
        self._states: dict[str, StateTable] = {}
        #: the subtask's operator (non-keyed) state
        self.operator: Final = OperatorStateBackend(operator_uid, self._keyed_kind)
        # restored keyed states no registration has claimed yet (see the module docstring)
        self._unclaimed: set[str] = set()
        self._current_key: Any = None
        self._current_group = -1
        self._has_current = False
        self._route_cache: KeyRouting | None = None
        #: the snapshots of this backend's states (full and incremental), the checkpoint
        #: notifications and the incremental base: the task's business, not the operators'
        self.snapshots: Final = SnapshotStrategy(
            self.task_id,
            key_type,
            key_group_range,
            max_parallelism,
            self._states,
            self.operator.states,
        )

    @classmethod
    def for_subtask(
        cls,
        operator_uid: str,
        subtask: int,
        parallelism: int,
        key_type: pa.DataType,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        *,
        storage: StateStorage | None = None,
    ) -> KeyedStateBackend:
        """The backend of subtask *subtask* of *parallelism*, with Flink's key group range."""
        rng = range_for_subtask(max_parallelism, parallelism, subtask)
        return cls(
            operator_uid,
            subtask,
            key_type,
            rng,
            max_parallelism,
            parallelism=parallelism,
            storage=storage,
        )

    @property
    def task_id(self) -> TaskId:
        return TaskId(self.operator_uid, self.subtask)

    def __repr__(self) -> str:
        return (
            f"KeyedStateBackend({self.operator_uid!r}, subtask={self.subtask}, "
            f"key_groups={self.key_group_range}, backend={self.storage.name}, "
            f"states={sorted(self._states)})"
        )

    def close(self) -> None:
        """Release the storage (idempotent): a ``rocksdb`` backend removes its local files.
        The backend is unusable afterwards."""
        self.storage.close()

    def storage_stats(self) -> StorageMetrics:
        """The backend's name and what its keyed states hold in memory and on disk."""
        return self.storage.stats(list(self._states.values()))

    def _keyed_kind(self, name: str) -> str | None:
        state = self._states.get(name)
        return None if state is None else state.descriptor.kind.value

    # -- registration ----------------------------------------------------------------------
    def register(self, descriptor: StateDescriptor) -> StateTable:
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
            if name in self.operator.states:
                raise StateError(f"state {name!r} is already operator state")
            state = self._states[name] = self.storage.new_table(descriptor)
        elif state.descriptor != descriptor:
            if name not in self._unclaimed:
                raise StateError(
                    f"state {name!r} is registered as {state.descriptor}, not {descriptor}"
                )
            migration = descriptor_migration(state.descriptor, descriptor, self.operator_uid)
            state = self._migrate_loaded(state, migration, descriptor)
        self._unclaimed.discard(name)
        return state

    def restored_state(self, stored: StateDescriptor) -> tuple[StateTable, Migration]:
        """For restore: the storage that rows of keyed state written with descriptor
        *stored* go to, and the migration of their value column. A state registered before
        the restore keeps its descriptor (the stored column is migrated to it, or
        StateError); a new one is registered as *stored*, unclaimed. A state loaded
        unclaimed from a blob of another type (a chain written across an evolution) moves to
        whichever of the two types the other migrates to."""
        name = stored.name
        state = self._states.get(name)
        if state is None:
            if name in self.operator.states:
                raise StateError(
                    f"{state_label(name, self.operator_uid)}: changed from {stored.kind.value} "
                    "state to operator list state: incompatible"
                )
            state = self._states[name] = self.storage.new_table(stored)
            self._unclaimed.add(name)
        elif state.descriptor != stored and name in self._unclaimed:
            try:
                forward = descriptor_migration(state.descriptor, stored, self.operator_uid)
            except StateError:
                pass  # the other direction, below
            else:
                state = self._migrate_loaded(state, forward, stored)
        return state, descriptor_migration(stored, state.descriptor, self.operator_uid)

    def _migrate_loaded(
        self, state: StateTable, migration: Migration, descriptor: StateDescriptor
    ) -> StateTable:
        """Rewrite the values *state* holds with *migration* (one Arrow column for all key
        groups) and make *descriptor* its descriptor; returns the state's table (a new one
        if the storage keeps the new descriptor in another layout)."""
        if migration.is_identity:
            state.descriptor = descriptor
            return state
        migrated = self._states[descriptor.name] = self.storage.migrate(
            state, migration, descriptor
        )
        return migrated

    def unclaimed_states(self) -> list[str]:
        """Names of restored states (keyed and operator) no registration has claimed yet."""
        return sorted(self._unclaimed | self.operator.unclaimed)

    def registered_states(self) -> tuple[list[str], list[str]]:
        """Names of the claimed keyed states and claimed operator states (registered by the
        operator, before or after a restore)."""
        return sorted(set(self._states) - self._unclaimed), self.operator.claimed()

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

    # operator state: the subtask's OperatorStateBackend (kept here for the state context)
    def operator_list_state(self, name: str, element_type: pa.DataType) -> OperatorListState:
        """Operator list state *name* (:meth:`OperatorStateBackend.list_state`)."""
        return self.operator.list_state(name, element_type)

    def restored_operator_state(self, name: str, element_type: pa.DataType) -> OperatorListState:
        """For restore (:meth:`OperatorStateBackend.restored_state`)."""
        return self.operator.restored_state(name, element_type)

    def operator_state_types(self) -> dict[str, pa.DataType]:
        """Element type of every operator list state, by name."""
        return self.operator.element_types()

    @property
    def tables(self) -> Mapping[str, StateTable]:
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
        if arr.null_count:
            raise StateError("keys must not be null")
        return arr

    def _route(self, keys: ArrayLike) -> KeyRouting:
        """Hash, range-check and sort *keys* by key group. The last routing of an Arrow
        array is cached by identity (arrays are immutable), so ``put_values`` right after
        ``get_values`` on the same batch does not hash again."""
        cached = self._route_cache
        if cached is not None and cached.source is keys:
            return cached
        routing = self._route_array(self._key_array(keys), keys)
        if isinstance(keys, pa.Array | pa.ChunkedArray):
            self._route_cache = routing
        return routing

    def _route_array(self, arr: pa.Array, source: object) -> KeyRouting:
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
        return KeyRouting(source, arr, kgs, groups, bounds, order)

    def _unique(self, routing: KeyRouting) -> tuple[KeyRouting, np.ndarray | None]:
        """*routing* with each repeated key at its last occurrence only (in input order),
        and the input positions kept (None: no key repeats)."""
        if pc.count_distinct(routing.array).as_py() == len(routing.array):
            return routing, None
        kept = last_occurrences(routing.array)
        return self._route_array(routing.array.take(pa.array(kept)), None), kept

    def _value_state(self, descriptor: ValueStateDescriptor) -> StateTable:
        self._expect(descriptor, ValueStateDescriptor)
        return self.register(descriptor)

    def get_values(self, descriptor: ValueStateDescriptor, keys: ArrayLike) -> pa.Array:
        """The value of each key (null where it has none), aligned with *keys*, as an array
        of ``descriptor.value_type``. Keys may repeat; all must be in this subtask's key
        groups."""
        state = self._value_state(descriptor)
        routing = self._route(keys)
        return state.read(routing).take(pa.array(routing.inverse()))

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
        unique, kept = self._unique(routing)
        written = vals if kept is None else vals.take(pa.array(kept))
        state.write(unique, written.take(pa.array(unique.order)))
        state.log(routing.key_groups, routing.array, vals)
        state.compact()

    def clear_values(self, descriptor: StateDescriptor, keys: ArrayLike) -> None:
        """Remove the entries of *keys* from any keyed state."""
        state = self.register(descriptor)
        routing = self._route(keys)
        state.delete(routing)
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
        found = state.read_python(routing)
        return [found[i] for i in routing.inverse().tolist()]

    def put_entries(self, descriptor: StateDescriptor, keys: ArrayLike, entries: list[Any]) -> None:
        """Replace the entry of each key of any keyed state (the Python values
        :meth:`get_entries` returns; None, an empty list or an empty map clears it), keys
        unique. O(keys), per key in Python."""
        state = self.register(descriptor)
        routing = self._route(keys)
        if len(entries) != len(routing.array):
            raise StateError(f"{len(routing.array)} keys but {len(entries)} entries")
        kept = [e if e else None for e in entries]
        state.write_python(routing, [kept[i] for i in routing.order.tolist()])
        state.log(routing.key_groups, routing.array, state.column(kept))
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
    def _state(self, descriptor: StateDescriptor | str) -> StateTable:
        if isinstance(descriptor, str):
            state = self._states.get(descriptor)
            if state is None:
                raise StateError(f"no keyed state {descriptor!r}")
            return state
        return self.register(descriptor)

    def keys(self, descriptor: StateDescriptor | str) -> pa.Array:
        """Every key with an entry in the state, in key group order."""
        _, keys, _ = self._state(descriptor).entries()
        return keys.cast(self.key_type)

    def to_table(self, descriptor: StateDescriptor | str) -> pa.Table:
        """Every (key group, key, value) of the state, in key group order, with the FULL
        blob schema."""
        return full_table(self._state(descriptor), self.key_type, self.max_parallelism)

    def value_count(self, descriptor: StateDescriptor | str | None = None) -> int:
        """Number of (key, state) entries, of one state or of all keyed states (an
        estimate on ``rocksdb``)."""
        if descriptor is None:
            return sum(s.count() for s in self._states.values())
        return self._state(descriptor).count()

    def holds_state(self) -> bool:
        """Whether any keyed state has an entry or any operator state an element."""
        return any(not s.is_empty() for s in self._states.values()) or self.operator.holds_state()
