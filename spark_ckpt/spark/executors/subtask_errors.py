"""The errors of the executors' subtasks, raised in their Spark tasks; a subtask host's error
crosses back into the task by its type name."""

from __future__ import annotations

from spark_ckpt.errors import SparkCkptError, StateError


class SubtaskStateLostError(StateError):
    """A subtask's state after the previous micro-batch is neither where its task runs nor
    rebuildable from its changelog: the run restarts from the latest completed
    checkpoint."""


class SubtaskHostLostError(StateError):
    """The subtask's host ended (killed, out of memory, its executor lost) before it
    answered: the task fails, and Spark's retry starts a new host."""


class SubtaskHostError(SparkCkptError):
    """The subtask's host failed the micro-batch with an error that has no counterpart in
    this process (its type and message are kept)."""
