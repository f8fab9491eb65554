"""The per-record views of keyed state an operator gets from its
:class:`~spark_ckpt.state.context.StateContext`: ``value()``/``update()``/``clear()`` on value
state, ``get()``/``add()`` on list state, ``get()``/``put()`` on map state, each acting on the
subtask's current key (as Spark's ``ValueState``/``ListState``/``MapState`` and Flink's). The
backend (:mod:`spark_ckpt.state.backend`) creates them over its tables."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import pyarrow as pa

from spark_ckpt.errors import StateError
from spark_ckpt.state.descriptor import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
    python_value,
)

if TYPE_CHECKING:
    from spark_ckpt.state.backends.table import StateTable

#: Keys or values as the vectorized API takes them: an Arrow array or a Python sequence.
ArrayLike: TypeAlias = "pa.Array | pa.ChunkedArray | Sequence[Any]"


#: Returns the current (key group, key) of a backend; StateError when none is set.
CurrentKey: TypeAlias = Callable[[], tuple[int, Any]]


class _PerKeyState:
    """Base of the per-record state views of keyed state *state*: they act on the key that
    *current* returns (the backend's current key)."""

    def __init__(self, current: CurrentKey, state: StateTable) -> None:
        self._current = current
        self._state = state

    @property
    def descriptor(self) -> StateDescriptor:
        return self._state.descriptor

    def _stored(self) -> Any:
        kg, key = self._current()
        return self._state.lookup(kg, key)

    def _store(self, value: Any) -> None:
        kg, key = self._current()
        self._state.store(kg, key, value)
        self._state.touch_one(kg, key)

    def clear(self) -> None:
        """Remove the current key's entry."""
        kg, key = self._current()
        self._state.remove(kg, key)
        self._state.touch_one(kg, key)


class ValueState(_PerKeyState):
    """The value of the current key. Returned values are the stored objects: do not mutate
    them (nested values), :meth:`update` instead."""

    def value(self) -> Any:
        """The current key's value, ``None`` if it has none."""
        return self._stored()

    def exists(self) -> bool:
        """Whether the current key has a value (Spark's ``ValueState.exists``)."""
        return self._stored() is not None

    def update(self, value: Any) -> None:
        """Set the current key's value; ``None`` clears it."""
        if value is None:
            self.clear()
            return
        desc = self._state.descriptor
        assert isinstance(desc, ValueStateDescriptor)
        self._store(python_value(value, desc.value_type, f"value of state {desc.name!r}"))


class ListState(_PerKeyState):
    """The list of the current key. An empty list is the same as no entry."""

    def _element(self, value: Any) -> Any:
        desc = self._state.descriptor
        assert isinstance(desc, ListStateDescriptor)
        if value is None:
            raise StateError(f"list state {desc.name!r}: null elements are not allowed")
        return python_value(value, desc.element_type, f"element of state {desc.name!r}")

    def get(self) -> list[Any]:
        """A copy of the current key's list (empty if none)."""
        stored = self._stored()
        return [] if stored is None else list(stored)

    def add(self, value: Any) -> None:
        self.add_all([value])

    def add_all(self, values: Iterable[Any]) -> None:
        converted = [self._element(v) for v in values]
        if not converted:
            return
        current = self._stored()
        if current is None:
            current = []
        current.extend(converted)  # in place: snapshots copy into Arrow
        self._store(current)

    def update(self, values: Iterable[Any]) -> None:
        """Replace the current key's list; an empty list clears it."""
        converted = [self._element(v) for v in values]
        if converted:
            self._store(converted)
        else:
            self.clear()


class MapState(_PerKeyState):
    """The map of the current key. An empty map is the same as no entry; map values may be
    null (use :meth:`contains` to tell a null value from a missing key)."""

    def _desc(self) -> MapStateDescriptor:
        desc = self._state.descriptor
        assert isinstance(desc, MapStateDescriptor)
        return desc

    def _map(self) -> dict[Any, Any]:
        stored = self._stored()
        return {} if stored is None else dict(stored)

    def _map_key(self, key: Any) -> Any:
        desc = self._desc()
        if key is None:
            raise StateError(f"map state {desc.name!r}: null map keys are not allowed")
        return python_value(key, desc.map_key_type, f"map key of state {desc.name!r}")

    def get(self, key: Any) -> Any:
        stored = self._stored()
        return None if stored is None else stored.get(self._map_key(key))

    def put(self, key: Any, value: Any) -> None:
        desc = self._desc()
        k = self._map_key(key)
        v = None if value is None else python_value(value, desc.map_value_type, "map value")
        stored = self._stored()
        if stored is None:
            stored = {}
        stored[k] = v  # in place: snapshots copy into Arrow, nothing else shares the dict
        self._store(stored)

    def put_all(self, entries: Iterable[tuple[Any, Any]]) -> None:
        for k, v in entries:
            self.put(k, v)

    def contains(self, key: Any) -> bool:
        stored = self._stored()
        return stored is not None and self._map_key(key) in stored

    def remove(self, key: Any) -> None:
        k = self._map_key(key)
        stored = self._stored()
        if stored is None or k not in stored:
            return
        del stored[k]
        if stored:
            self._store(stored)
        else:
            self.clear()

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._map().items())

    def keys(self) -> list[Any]:
        return list(self._map().keys())

    def values(self) -> list[Any]:
        return list(self._map().values())

    def is_empty(self) -> bool:
        return not self._stored()
