"""The operator (non-keyed) state of one operator subtask, apart from its keyed state, as in
Flink (``OperatorStateBackend`` beside ``KeyedStateBackend``).

Operator list state is small, held in memory whatever the keyed state backend, and snapshot
whole; on restore its elements are dealt round-robin over the new subtasks
(:mod:`~spark_ckpt.state.state_restore`). Like the keyed backend it lives on the task thread.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from spark_ckpt.errors import StateError
from spark_ckpt.state.descriptor import check_arrow_type, check_state_name
from spark_ckpt.state.operator_state import OperatorListState
from spark_ckpt.state.schema_evolution import plan_migration, state_label


class OperatorStateBackend:
    """Operator list states of operator *operator_uid*'s subtask, by name. *keyed_kind*
    tells the kind of the keyed state of a name (None: none), so that one name is never
    both."""

    def __init__(self, operator_uid: str, keyed_kind: Callable[[str], str | None]) -> None:
        self.operator_uid = operator_uid
        self._keyed_kind = keyed_kind
        #: every operator state, registered or restored, by name
        self.states: dict[str, OperatorListState] = {}
        # restored states no registration has claimed yet
        self.unclaimed: set[str] = set()

    def list_state(self, name: str, element_type: pa.DataType) -> OperatorListState:
        """Operator list state *name* (registered on first use). A restored, unclaimed
        operator state of that name is claimed, its elements migrated to *element_type* if
        they were stored as another type (StateError if incompatible)."""
        check_state_name(name)
        check_arrow_type("element_type", element_type)
        state = self.states.get(name)
        if state is None:
            if self._keyed_kind(name) is not None:
                raise StateError(f"state {name!r} is already keyed state")
            state = self.states[name] = OperatorListState(name, element_type)
        elif state.element_type != element_type:
            if name not in self.unclaimed:
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
            state = self.states[name] = OperatorListState(name, element_type)
            state.update(migrated.to_pylist())
        self.unclaimed.discard(name)
        return state

    def restored_state(self, name: str, element_type: pa.DataType) -> OperatorListState:
        """For restore: operator list state *name* to load elements of *element_type* into
        (already migrated by the caller to the registered type, if any): the registered
        state, or a new unclaimed one."""
        state = self.states.get(name)
        if state is None:
            kind = self._keyed_kind(name)
            if kind is not None:
                raise StateError(
                    f"{state_label(name, self.operator_uid)}: changed from operator list state "
                    f"to {kind} state: incompatible"
                )
            state = self.states[name] = OperatorListState(name, element_type)
            self.unclaimed.add(name)
        elif state.element_type != element_type:
            raise StateError(
                f"operator state {name!r} holds {state.element_type}, not {element_type}"
            )
        return state

    def element_types(self) -> dict[str, pa.DataType]:
        """Element type of every operator list state, by name."""
        return {n: s.element_type for n, s in self.states.items()}

    def claimed(self) -> list[str]:
        """Names of the operator states the operator registered."""
        return sorted(set(self.states) - self.unclaimed)

    def holds_state(self) -> bool:
        """Whether any operator state has an element."""
        return any(s.get() for s in self.states.values())
