"""What a pipeline runs: the job's description, shared by every run (attempt) of it.

A :class:`JobSpec` holds the source's ``ckpt-source`` options, the operators (with their
stable uids), the output Delta table and the task layout. It is a value: each run builds its
own foreachBatch function, coordinator and sink recovery from it, so nothing stateful
survives from one attempt into the next.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spark_ckpt.errors import ConfigError
from spark_ckpt.protocol.trace import NOOP_TRACER, Tracer
from spark_ckpt.runtime.operator import KeyedOperator

Source = Mapping[str, object]
Operators = KeyedOperator | Sequence[KeyedOperator]


@dataclass(frozen=True)
class JobSpec:
    """*source* (``ckpt-source`` options) through *operators* (keyed state, aligned as the
    pipeline's configuration says) into the Delta table *output*, exactly-once, on
    *parallelism* subtasks. *vertex*: the task vertex name (default: the first operator's
    uid). *pipelined*: process a micro-batch while Spark reads the next (see
    :class:`~spark_ckpt.spark.batch_aligner.BatchAligner`). *tracer*: receives the engine's
    spans where the foreachBatch function runs (picklable and cheap; see
    :mod:`spark_ckpt.protocol.trace`), injected like the clock."""

    source: Source
    operators: tuple[KeyedOperator, ...]
    output: str
    parallelism: int = 2
    vertex: str | None = None
    pipelined: bool = True
    tracer: Tracer = NOOP_TRACER

    @staticmethod
    def of(
        source: Source,
        operators: Operators,
        *,
        output: str,
        parallelism: int = 2,
        vertex: str | None = None,
        pipelined: bool = True,
        tracer: Tracer = NOOP_TRACER,
    ) -> JobSpec:
        """A validated spec: at least one operator; a local *output* made absolute."""
        ops = (operators,) if isinstance(operators, KeyedOperator) else tuple(operators)
        if not ops:
            raise ConfigError("operators", (), "at least one KeyedOperator")
        out = output if "://" in output else os.path.abspath(output)
        return JobSpec(dict(source), ops, out, parallelism, vertex, pipelined, tracer)
