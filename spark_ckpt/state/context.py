"""The user's state API: what an operator sees of its subtask's state.

Modelled on Spark's ``stateful_processor.py`` (``StatefulProcessorHandle`` and the
``ValueState``/``ListState``/``MapState`` views) and Flink's ``KeyedStateStore``: an operator
registers and reads/writes its state through a :class:`StateContext` and the per-record views
it returns, and cannot reach the backend's snapshot, restore or checkpoint-notification
methods, which belong to the task running it (:class:`~spark_ckpt.runtime.task.OperatorTask`).
The backend (:mod:`spark_ckpt.state.backend`) creates the views; their storage is its
business.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spark_ckpt.state.descriptor import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from spark_ckpt.state.operator_state import OperatorListState
from spark_ckpt.state.views import ArrayLike, ListState, MapState, ValueState

if TYPE_CHECKING:
    from spark_ckpt.state.backend import KeyedStateBackend


class StateContext:
    """An operator's access to the state of its subtask (the backend it wraps stays with the
    task). Same threading contract as the backend: use it only from the calls the task makes
    into the operator (``open``, ``process_batch``, ``process_record``), and keep no
    references into it across calls.

    * registration and per-record views: :meth:`value_state`, :meth:`list_state`,
      :meth:`map_state` (registered on first use, so ``open`` registers by calling them);
      the views act on the key set by :meth:`set_current_key`;
    * vectorized access to value state: :meth:`get_values`, :meth:`put_values`, and
      :meth:`clear_values` for any keyed state — whole Arrow key arrays, no per-row Python;
    * operator (non-keyed) list state: :meth:`operator_list_state`.

    All keys must belong to the subtask's key groups (the task routes them so);
    :class:`~spark_ckpt.errors.StateError` otherwise."""

    __slots__ = ("_backend",)

    def __init__(self, backend: KeyedStateBackend) -> None:
        self._backend = backend

    def __repr__(self) -> str:
        return f"StateContext({self._backend!r})"

    # -- registration, per-record views ------------------------------------------------------
    def value_state(self, descriptor: ValueStateDescriptor) -> ValueState:
        """The per-record view of value state *descriptor* (registered on first use)."""
        return self._backend.value_state(descriptor)

    def list_state(self, descriptor: ListStateDescriptor) -> ListState:
        """The per-record view of list state *descriptor* (registered on first use)."""
        return self._backend.list_state(descriptor)

    def map_state(self, descriptor: MapStateDescriptor) -> MapState:
        """The per-record view of map state *descriptor* (registered on first use)."""
        return self._backend.map_state(descriptor)

    # -- current key ---------------------------------------------------------------------------
    def set_current_key(self, key: Any) -> None:
        """Make *key* the key the per-record views act on; StateError if it is null, not of
        the key type, or outside the subtask's key groups."""
        self._backend.set_current_key(key)

    @property
    def current_key(self) -> Any:
        """The key set by :meth:`set_current_key`; StateError if none was set."""
        return self._backend.current_key

    # -- vectorized access ---------------------------------------------------------------------
    def get_values(self, descriptor: ValueStateDescriptor, keys: ArrayLike) -> pa.Array:
        """The value of each key (null where it has none), aligned with *keys*, as an array
        of ``descriptor.value_type``. Keys may repeat."""
        return self._backend.get_values(descriptor, keys)

    def put_values(
        self, descriptor: ValueStateDescriptor, keys: ArrayLike, values: ArrayLike
    ) -> None:
        """Set the value of each key; a null value clears the key. If a key repeats, its
        last occurrence wins. Nothing changes if any key is invalid."""
        self._backend.put_values(descriptor, keys, values)

    def clear_values(self, descriptor: StateDescriptor, keys: ArrayLike) -> None:
        """Remove the entries of *keys* from keyed state *descriptor* (any kind)."""
        self._backend.clear_values(descriptor, keys)

    # -- operator state ------------------------------------------------------------------------
    def operator_list_state(self, name: str, element_type: pa.DataType) -> OperatorListState:
        """Operator list state *name* of the subtask (registered on first use)."""
        return self._backend.operator_list_state(name, element_type)
