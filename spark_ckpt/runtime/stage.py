"""Keyed stages: a job as a chain of stages, re-keyed between them (Flink's ``keyBy`` between
operators).

A **stage** is what a pipeline was before graphs: a chain of operators keyed by one column,
run by ``parallelism`` subtasks that own the key groups of ``max_parallelism``. A job of
several stages passes each stage's output to the next one, routed by the next stage's key::

    source ─▶ stage "users" (keyed by user) ─▶ stage "countries" (keyed by country) ─▶ output

The first stage reads the pipeline's source or inputs. A later stage reads what the
subtasks of the stage before it emit: each upstream subtask is one of its **channels**, and
each upstream subtask forwards, in order on that channel, its output rows, its event time
(its watermark) and every barrier it snapshots at (:mod:`spark_ckpt.runtime.stage_output`). A
downstream subtask aligns the barriers of its channels as a first-stage subtask aligns the
source's, so one checkpoint covers every stage; its watermark is the minimum of its
upstream subtasks' watermarks (Flink's rule for an operator with several input channels).

A stage's own state (its watermark valve, its channel state) is stored under its vertex
(:func:`stage_vertex`); its operators' state under their uids, wherever they stand, so
operators may move between stages across an upgrade. Pure: no Spark, no storage.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from spark_ckpt.errors import ConfigError
from spark_ckpt.runtime.operator import KeyedOperator, chain_key

#: The vertex of the first stage (its tasks' acknowledgements and own state): the name a
#: pipeline of one stage has always used.
FIRST_STAGE_VERTEX: Final = "chain"
#: The prefix of a later stage's vertex: ``stage:<name>``.
STAGE_PREFIX: Final = "stage:"
#: Limits of a stage's parallelism (Flink's upper bound of max parallelism).
MAX_PARALLELISM_LIMIT: Final = 32768
#: The checkpoint property naming a job's stages (JSON: stage name by vertex).
STAGES: Final = "stages"
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def stage_vertex(position: int, name: str) -> str:
    """The vertex of the stage at *position* (0: the first) named *name*."""
    return FIRST_STAGE_VERTEX if position == 0 else STAGE_PREFIX + name


def stage_output_name(vertex: str) -> str:
    """How the run's topology names the own output table of the stage of *vertex* (not a
    stage's last output, which is the job's): a name no side output can have."""
    return f"stage-output:{vertex}"


def stage_names(properties: Mapping[str, str]) -> dict[str, str]:
    """The stages' names by vertex, as a checkpoint's *properties* record them (empty: a job
    of one stage, or an unreadable record)."""
    import json

    try:
        found = json.loads(properties.get(STAGES) or "{}")
        return {str(v): str(n) for v, n in dict(found).items()}
    except (TypeError, ValueError):
        return {}


def stage_rows(
    tasks: Sequence[tuple[str, int, int]], names: Mapping[str, str]
) -> list[dict[str, object]]:
    """Per stage of a checkpoint, in order (the first stage's vertex first, then by vertex),
    from (vertex, subtask, state bytes) per acknowledging task: its name (*names*, by vertex;
    the vertex where none is recorded), vertex, subtasks and state size."""
    per: dict[str, list[int]] = {}
    for vertex, _, state in tasks:
        agg = per.setdefault(vertex, [0, 0])
        agg[0] += 1
        agg[1] += state
    order = sorted(per, key=lambda v: (is_later_stage_vertex(v), v))
    return [
        {
            "stage": names.get(v, v.removeprefix(STAGE_PREFIX)),
            "vertex": v,
            "subtasks": per[v][0],
            "state_bytes": per[v][1],
        }
        for v in order
    ]


def is_later_stage_vertex(vertex: str) -> bool:
    """Whether *vertex* is a later stage's (not the first stage's, under any older name)."""
    return vertex.startswith(STAGE_PREFIX)


@dataclass(frozen=True, init=False)
class Stage:
    """One keyed stage of a job (see the module docstring): *operators*, keyed by one column
    (the first keyed operator's), on *parallelism* subtasks (None: the job's ``parallelism``)
    over *max_parallelism* key groups (None: the checkpoint configuration's). *name*: how the
    checkpoint page, ``spark-ckpt checkpoints show`` and the offline tools name the stage
    (default ``stage_1``, ``stage_2``, ...); keep it across upgrades. *output*: a Delta table
    that also receives this stage's output, exactly once with the same checkpoints (the last
    stage's output goes to the job's ``output``). *event_time*: the column of this stage's input
    rows that its operators' event time is read from (a later stage; default: the pipeline's
    event-time column, when the rows keep it). Frozen and picklable."""

    operators: tuple[KeyedOperator, ...]
    name: str | None = None
    parallelism: int | None = None
    max_parallelism: int | None = None
    output: str | None = None
    event_time: str | None = None
    #: set by the job (:meth:`placed`): the stage's vertex
    vertex: str = field(default="")

    def __init__(
        self,
        operators: KeyedOperator | Sequence[KeyedOperator],
        *,
        name: str | None = None,
        parallelism: int | None = None,
        max_parallelism: int | None = None,
        output: str | None = None,
        event_time: str | None = None,
    ) -> None:
        ops = (operators,) if isinstance(operators, KeyedOperator) else tuple(operators)
        where = f"Stage({name!r})" if name else "Stage"
        if not ops:
            raise ConfigError(f"{where}.operators", (), "at least one KeyedOperator")
        for op in ops:
            if not isinstance(op, KeyedOperator):
                raise ConfigError(
                    f"{where}.operators", type(op).__name__, "KeyedOperator instances"
                )
        keys = sorted({op.key_column for op in ops if op.keyed})
        if len(keys) > 1:
            raise ConfigError(
                f"{where}.operators",
                [op.uid for op in ops],
                "operators keyed by one column (a stage routes its rows by one key; put "
                f"operators keyed by another in a stage of their own: {', '.join(keys)})",
            )
        if name is not None and (not isinstance(name, str) or not _NAME.match(name)):
            raise ConfigError(
                "Stage.name", name, "a letter then letters, digits or '_' (e.g. 'users')"
            )
        for option, value in (("parallelism", parallelism), ("max_parallelism", max_parallelism)):
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not 1 <= value <= MAX_PARALLELISM_LIMIT
            ):
                raise ConfigError(
                    f"{where}.{option}", value, f"an integer in 1..{MAX_PARALLELISM_LIMIT}"
                )
        if (
            parallelism is not None
            and max_parallelism is not None
            and parallelism > max_parallelism
        ):
            raise ConfigError(
                f"{where}.parallelism", parallelism, f"at most max_parallelism ({max_parallelism})"
            )
        if output is not None and (not isinstance(output, str) or not output):
            raise ConfigError(f"{where}.output", output, "the path of a Delta table")
        if event_time is not None and (not isinstance(event_time, str) or not event_time):
            raise ConfigError(f"{where}.event_time", event_time, "the name of a timestamp column")
        object.__setattr__(self, "operators", ops)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "parallelism", parallelism)
        object.__setattr__(self, "max_parallelism", max_parallelism)
        object.__setattr__(self, "output", output)
        object.__setattr__(self, "event_time", event_time)
        object.__setattr__(self, "vertex", "")

    @property
    def key_column(self) -> str:
        """The column that routes the stage's rows to its subtasks."""
        return chain_key(self.operators)

    def placed(
        self, position: int, parallelism: int, max_parallelism: int, output: str | None
    ) -> Stage:
        """This stage as the job runs it at *position*: named, its vertex, parallelism and
        max parallelism decided, its output path normalized (*output*)."""
        name = self.name or f"stage_{position + 1}"
        p = self.parallelism or parallelism
        mp = self.max_parallelism or max_parallelism
        if p > mp:
            raise ConfigError(f"Stage({name!r}).parallelism", p, f"at most max_parallelism ({mp})")
        placed = copy.copy(self)
        for attr, value in (
            ("name", name),
            ("parallelism", p),
            ("max_parallelism", mp),
            ("output", output),
            ("vertex", stage_vertex(position, name)),
        ):
            object.__setattr__(placed, attr, value)
        return placed
