"""State schema evolution: which changes of a state's Arrow type a restore accepts, and the
vectorized migration of stored columns to the new type.

When an operator restores state written by an earlier version of itself, the descriptor it
registers may differ from the one the state was written with. :func:`plan_migration` (for
an Arrow type) and :func:`descriptor_migration` (for a whole descriptor) decide, from the
*types only*, whether the stored state can be read as the new type, and return a
:class:`Migration` — a function over a whole Arrow column (casts and struct/list/map
rebuilds, no per-row Python) — or raise :class:`~spark_ckpt.errors.StateError` naming the
operator (when known), the state and the field path of the first incompatible change.

Rules (applied recursively; the path of a struct field is ``a.b``, of a list element
``element``, of a map key ``key`` and of a map value ``value``, joined with dots):

============================================  ===============================================
change                                        outcome
============================================  ===============================================
identical type                                kept as is
integer widening (int8→int16→int32→int64,     cast; integers to floating point use Arrow's
uint widening, uintN→int(>N), int≤16 bits →   *safe* cast, so a value that float64 cannot
float32, any int → float64), float16→         hold exactly (beyond 2**53) refuses the
float32→float64                               restore with StateError at migration time
struct: new nullable field                    added, null in every restored row
struct: fields reordered                      rebuilt by name
struct/list/map: compatible member changes    rebuilt member by member
non-nullable → nullable (field, element)      accepted
anything else                                 StateError: another type (``string → int64``),
                                              narrowing (``int64 → int32``), signed →
                                              unsigned, a new *non-nullable* field, a removed
                                              field, nullable → non-nullable, list ↔
                                              large_list, a changed map key type
============================================  ===============================================

A **removed struct field is refused**: accepting it would silently drop stored data, and a
renamed field (removed + added) would lose its values without notice. Remove a field by
migrating the state explicitly (a new state name), not by editing the type in place.

At the descriptor level (:func:`descriptor_migration`) the state kind (value, list, map) and
map key types must not change, nor the keyed state's *key type* (:func:`check_key_type`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import StateError
from spark_ckpt.state.descriptor import (
    CONVERSION_ERRORS,
    TTL_UPDATED,
    StateDescriptor,
    stores_ttl,
)

#: A column as Arrow hands it out: one array or a chunked array.
Column: TypeAlias = "pa.Array | pa.ChunkedArray"

_ArrayFn: TypeAlias = Callable[[pa.Array], pa.Array]

#: Lossless widenings of numeric types (source -> accepted targets), besides identity.
_SIGNED = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
_UNSIGNED = (pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64())
_FLOATS = (pa.float16(), pa.float32(), pa.float64())


def _widenings() -> dict[pa.DataType, frozenset[pa.DataType]]:
    out: dict[pa.DataType, set[pa.DataType]] = {}
    for i, t in enumerate(_SIGNED):
        out[t] = {*_SIGNED[i + 1 :], pa.float64()}
        if t.bit_width <= 16:
            out[t].add(pa.float32())
    for i, t in enumerate(_UNSIGNED):
        out[t] = {*_UNSIGNED[i + 1 :], pa.float64()}
        out[t].update(s for s in _SIGNED if s.bit_width > t.bit_width)
        if t.bit_width <= 16:
            out[t].add(pa.float32())
    for i, t in enumerate(_FLOATS):
        out[t] = set(_FLOATS[i + 1 :])
    return {k: frozenset(v) for k, v in out.items()}


#: Numeric source type -> the types it may widen to (identity excluded).
WIDENINGS: dict[pa.DataType, frozenset[pa.DataType]] = _widenings()


def state_label(
    state: str, operator_uid: str | None = None, *, operator_state: bool = False
) -> str:
    """``state 'x' of operator 'op'`` (the prefix of every evolution error)."""
    what = "operator state" if operator_state else "state"
    label = f"{what} {state!r}"
    return label if operator_uid is None else f"{label} of operator {operator_uid!r}"


def _where(path: str) -> str:
    return f"field {path!r}" if path else "value type"


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


@dataclass(frozen=True)
class Migration:
    """Reads a stored column of type :attr:`source` as :attr:`target` (see the module
    docstring for which pairs exist). Calling it on a column (array or chunked array) of
    *source* returns the column as *target*, built with Arrow kernels only; nulls stay
    null. Raises :class:`~spark_ckpt.errors.StateError` (naming the state) when a value
    does not survive a safe cast (an integer beyond float64's exact range)."""

    source: pa.DataType
    target: pa.DataType
    label: str
    _fn: _ArrayFn | None  # None: identity

    @property
    def is_identity(self) -> bool:
        """Whether the stored column is already of the target type (nothing to do)."""
        return self._fn is None

    def __call__(self, column: Column) -> Column:
        fn = self._fn
        if fn is None:
            return column
        try:
            if isinstance(column, pa.ChunkedArray):
                return pa.chunked_array([fn(c) for c in column.chunks], type=self.target)
            return fn(column)
        except CONVERSION_ERRORS as e:
            raise StateError(
                f"{self.label}: stored values of {self.source} do not convert to {self.target}: {e}"
            ) from e


def _refuse(label: str, path: str, stored: pa.DataType, target: pa.DataType) -> StateError:
    return StateError(f"{label}: {_where(path)} changed from {stored} to {target}: incompatible")


def plan_migration(
    stored: pa.DataType,
    target: pa.DataType,
    *,
    state: str,
    operator_uid: str | None = None,
    operator_state: bool = False,
) -> Migration:
    """The migration of a stored column of Arrow type *stored* to type *target* for state
    *state* (of operator *operator_uid*, when known). Raises
    :class:`~spark_ckpt.errors.StateError` naming the state and the path of the first
    incompatible change (rules: module docstring). Type-level only: no data is read."""
    label = state_label(state, operator_uid, operator_state=operator_state)
    fn = _plan(stored, target, "", label)
    return Migration(stored, target, label, fn)


def descriptor_migration(
    stored: StateDescriptor, target: StateDescriptor, operator_uid: str | None = None
) -> Migration:
    """The migration of the value column of keyed state written with descriptor *stored*
    to descriptor *target* (same name). StateError if the kind changed (value, list, map),
    if a map's key type changed, or if the value types are incompatible."""
    label = state_label(target.name, operator_uid)
    if stored.kind is not target.kind:
        raise StateError(
            f"{label}: changed from {stored.kind.value} state to {target.kind.value} state: "
            "incompatible"
        )
    if stores_ttl(stored) != stores_ttl(target):
        raise StateError(_ttl_change(label, added=stores_ttl(target)))
    return plan_migration(
        stored.column_type, target.column_type, state=target.name, operator_uid=operator_uid
    )


def _ttl_change(label: str, *, added: bool) -> str:
    """Why a state cannot gain or lose its TTL at a restore (as in Flink)."""
    if added:
        return (
            f"{label}: its descriptor has a TTL but the restored state was written without "
            "one, so its entries have no time of last update: register the TTL state under "
            "a new name, or give the entries a time offline (StateReader.keyed, then "
            "SavepointWriter.with_keyed_state with each value as a struct of 'value' and "
            f"'{TTL_UPDATED}', ms since the epoch)"
        )
    return (
        f"{label}: the restored state was written with a TTL but its descriptor has none: "
        "keep the TTL (its duration may change), or register the state under a new name"
    )


def check_key_type(
    stored: pa.DataType, target: pa.DataType, *, state: str, operator_uid: str | None = None
) -> None:
    """StateError unless the stored key type of keyed state *state* is *target* (keys are
    hashed into key groups and compared by value: they never evolve)."""
    if stored != target:
        raise StateError(
            f"{state_label(state, operator_uid)}: key type changed from {stored} to {target}: "
            "incompatible (keys must keep their type)"
        )


def _plan(stored: pa.DataType, target: pa.DataType, path: str, label: str) -> _ArrayFn | None:
    """The array function migrating *stored* to *target* (None: identity), or StateError."""
    if stored == target:
        return None
    if pa.types.is_struct(stored) and pa.types.is_struct(target):
        return _plan_struct(stored, target, path, label)
    if (pa.types.is_list(stored) and pa.types.is_list(target)) or (
        pa.types.is_large_list(stored) and pa.types.is_large_list(target)
    ):
        return _plan_list(stored, target, path, label)
    if pa.types.is_map(stored) and pa.types.is_map(target):
        return _plan_map(stored, target, path, label)
    if target in WIDENINGS.get(stored, frozenset()):
        return lambda arr: arr.cast(target, safe=True)
    raise _refuse(label, path, stored, target)


def _check_nullability(old: pa.Field, new: pa.Field, path: str, label: str) -> None:
    if old.nullable and not new.nullable:
        raise StateError(
            f"{label}: {_where(path)} changed from nullable to non-nullable: incompatible"
        )


def _plan_struct(
    stored: pa.StructType, target: pa.StructType, path: str, label: str
) -> _ArrayFn | None:
    old_fields = [stored.field(i) for i in range(stored.num_fields)]
    new_fields = [target.field(i) for i in range(target.num_fields)]
    for fields, which in ((old_fields, stored), (new_fields, target)):
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            raise StateError(
                f"{label}: {_where(path)} {which} has duplicate field names: incompatible"
            )
    old_by_name = {f.name: (i, f) for i, f in enumerate(old_fields)}
    new_names = {f.name for f in new_fields}
    for f in old_fields:
        if f.name not in new_names:
            raise StateError(
                f"{label}: field {_join(path, f.name)!r} ({f.type}) was removed: incompatible "
                "(its stored values would be lost)"
            )
    # per target field: (source index or None for a new field, child function)
    plan: list[tuple[int | None, _ArrayFn | None, pa.Field]] = []
    for f in new_fields:
        child = _join(path, f.name)
        found = old_by_name.get(f.name)
        if found is None:
            if not f.nullable:
                raise StateError(
                    f"{label}: field {child!r} was added as non-nullable {f.type}: incompatible "
                    "(restored rows have no value for it; add it as nullable)"
                )
            plan.append((None, None, f))
            continue
        index, old = found
        _check_nullability(old, f, child, label)
        plan.append((index, _plan(old.type, f.type, child, label), f))

    def rebuild(arr: pa.Array) -> pa.Array:
        children = arr.flatten()  # applies the struct's offset and validity
        columns = [
            pa.nulls(len(arr), f.type)
            if index is None
            else (children[index] if fn is None else fn(children[index]))
            for index, fn, f in plan
        ]
        mask = arr.is_null() if arr.null_count else None
        return pa.StructArray.from_arrays(columns, fields=new_fields, mask=mask)

    return rebuild


def _rebased(arr: pa.Array) -> tuple[pa.Array, int, int]:
    """Offsets of the list/map array *arr* starting at 0 (a fresh array: Arrow refuses
    sliced offsets with a validity bitmap) and the range of its child they cover."""
    offsets = arr.offsets
    start, end = offsets[0].as_py(), offsets[len(offsets) - 1].as_py()
    return pc.subtract(offsets, pa.scalar(start, offsets.type)), start, end


def _plan_list(
    stored: pa.ListType | pa.LargeListType,
    target: pa.ListType | pa.LargeListType,
    path: str,
    label: str,
) -> _ArrayFn | None:
    child = _join(path, "element")
    _check_nullability(stored.value_field, target.value_field, child, label)
    fn = _plan(stored.value_type, target.value_type, child, label)
    cls = pa.LargeListArray if pa.types.is_large_list(target) else pa.ListArray

    def rebuild(arr: pa.Array) -> pa.Array:
        offsets, start, end = _rebased(arr)
        values = arr.values.slice(start, end - start)
        if fn is not None:
            values = fn(values)
        mask = arr.is_null() if arr.null_count else None
        return cls.from_arrays(offsets, values, type=target, mask=mask)

    return rebuild


def _plan_map(stored: pa.MapType, target: pa.MapType, path: str, label: str) -> _ArrayFn | None:
    if stored.key_type != target.key_type:
        raise StateError(
            f"{label}: field {_join(path, 'key')!r} changed from {stored.key_type} to "
            f"{target.key_type}: incompatible (map keys must keep their type)"
        )
    child = _join(path, "value")
    _check_nullability(stored.item_field, target.item_field, child, label)
    fn = _plan(stored.item_type, target.item_type, child, label)

    def rebuild(arr: pa.Array) -> pa.Array:
        offsets, start, end = _rebased(arr)
        keys = arr.keys.slice(start, end - start)
        items = arr.items.slice(start, end - start)
        if fn is not None:
            items = fn(items)
        mask = arr.is_null() if arr.null_count else None
        return pa.MapArray.from_arrays(offsets, keys, items, type=target, mask=mask)

    return rebuild
