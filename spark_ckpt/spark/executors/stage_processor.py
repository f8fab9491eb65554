"""A later stage's subtasks on the executors: the ``transformWithStateInPandas`` processor of
the executor path's query (:func:`~spark_ckpt.spark.executors.subtask_function.subtask_query`).

Spark refuses two ``applyInPandasWithState`` in one streaming query but chains
``transformWithStateInPandas`` after it, so each stage after the first is one: grouped by the
group keys of its subtasks (:mod:`spark_ckpt.spark.executors.routing`), it receives the
payloads the stage before it forwarded to each subtask
(:mod:`spark_ckpt.runtime.stage_output`) and hands them to the subtask's host exactly as the
first stage does (:class:`~spark_ckpt.spark.executors.subtask_function.SubtaskFunction`, at
its stage's position). Spark's state for the group is one value, the subtask's fence, as the
first stage keeps it in ``GroupState``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from spark_ckpt.spark.executors.executor_cache import FENCE_SCHEMA

if TYPE_CHECKING:
    from spark_ckpt.spark.executors.subtask_function import SubtaskFunction


class FenceState:
    """The ``GroupState`` face (``exists``, ``get``, ``update``) of a processor's value
    state, which :meth:`SubtaskFunction.__call__
    <spark_ckpt.spark.executors.subtask_function.SubtaskFunction.__call__>` keeps the fence
    in."""

    def __init__(self, state: Any) -> None:
        self._state = state

    @property
    def exists(self) -> bool:
        return bool(self._state.exists())

    @property
    def get(self) -> tuple[Any, ...]:
        return tuple(self._state.get())

    def update(self, row: tuple[Any, ...]) -> None:
        self._state.update(row)


class StageProcessor(StatefulProcessor):  # type: ignore[misc]
    """See the module docstring. Picklable: it holds the stage's function, which builds its
    runtime where it runs."""

    def __init__(self, function: SubtaskFunction) -> None:
        self.function = function
        self._fence: FenceState | None = None

    def init(self, handle: Any) -> None:
        """Spark's hook, in the Python worker before a group's rows: registers the fence."""
        self._fence = FenceState(handle.getValueState("fence", FENCE_SCHEMA))

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        """Spark's hook, once per subtask and micro-batch: the subtask's micro-batch."""
        assert self._fence is not None
        yield from self.function(key, rows, self._fence)

    def close(self) -> None:
        """Spark's hook when the partition ends: nothing to release (the host keeps the task)."""
