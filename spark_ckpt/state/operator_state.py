"""Operator (non-keyed) list state of one subtask.

On rescale the elements of all old subtasks are concatenated in subtask order and dealt
round-robin (:mod:`spark_ckpt.state.state_restore`): new subtask ``i`` gets the elements at
positions ``j`` with ``j % parallelism == i``. Snapshots write one OPERATOR blob per state
per subtask (:func:`~spark_ckpt.state.descriptor.operator_blob_schema`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from spark_ckpt.errors import StateError
from spark_ckpt.state.descriptor import python_value


class OperatorListState:
    """Operator list state *name* of one subtask: non-null elements of *element_type*, in
    insertion order. Not thread-safe (it lives on the task thread, like the backend)."""

    def __init__(self, name: str, element_type: pa.DataType) -> None:
        self.name = name
        self.element_type = element_type
        self._items: list[Any] = []

    def get(self) -> list[Any]:
        """A copy of the elements."""
        return list(self._items)

    def add(self, value: Any) -> None:
        """Append *value*; StateError if it is null or not of the element type."""
        self._items.append(self._convert(value))

    def add_all(self, values: Iterable[Any]) -> None:
        """Append *values*; nothing changes if one of them is invalid."""
        converted = [self._convert(v) for v in values]
        self._items.extend(converted)

    def update(self, values: Iterable[Any]) -> None:
        """Replace the elements by *values*; nothing changes if one of them is invalid."""
        self._items = [self._convert(v) for v in values]

    def clear(self) -> None:
        self._items = []

    def _convert(self, value: Any) -> Any:
        if value is None:
            raise StateError(f"operator state {self.name!r}: null elements are not allowed")
        return python_value(value, self.element_type, "element")
