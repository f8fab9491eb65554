"""Keyed operators over several inputs: Flink's ``KeyedCoProcessFunction``, vectorized.

A :class:`KeyedCoOperator` is the first operator of the chain of a pipeline with several
named inputs (``Pipeline.run(sources={...})``, :mod:`spark_ckpt.sources.inputs`). It names the
inputs it reads and, per input, the column its rows are keyed by (:attr:`KeyedCoOperator.keys`);
the key columns must have one Arrow type, so that the rows of every input with one key reach
the same subtask and the same keyed state. Per micro-batch it receives one Arrow table per input
that has rows (:meth:`KeyedCoOperator.process_inputs`: that input's own columns, rows of the
subtask's key groups only), with the same
:class:`~spark_ckpt.state.context.StateContext` a one-input operator gets: value, list and map
state, event- and processing-time timers, TTL. Its output goes down the chain as any
operator's.

:class:`RecordCoOperator` is the per-record form: one method per input, ``process_<input>``
(Flink's ``processElement1``/``processElement2``), with the current key set.

Rows of one micro-batch come input by input in the order of :attr:`KeyedCoOperator.inputs`,
each input's in channel order: a replay hands the operator the same tables, so its output is
the same.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from spark_ckpt.errors import ConfigError, StateError
from spark_ckpt.runtime.operator import KeyedOperator, fired_per_record, rows_of
from spark_ckpt.state.context import StateContext


class KeyedCoOperator(KeyedOperator):
    """Base of keyed operators over several inputs (see the module docstring). *keys*: per
    input name, the column its rows are keyed by; *key_column*: the key's name where the
    operator names it itself (its timers' key column; default: the first input's)."""

    def __init__(
        self,
        uid: str,
        keys: Mapping[str, str],
        key_type: pa.DataType,
        key_column: str | None = None,
    ) -> None:
        if len(keys) < 2:
            raise ConfigError("keys", dict(keys), "a key column for each of two or more inputs")
        self.keys = dict(keys)
        super().__init__(uid, key_column or next(iter(self.keys.values())), key_type)

    @property
    def inputs(self) -> tuple[str, ...]:
        """The names of the inputs the operator reads, in the order it receives them."""
        return tuple(self.keys)

    @abstractmethod
    def process_inputs(
        self, batches: Mapping[str, pa.Table], state: StateContext
    ) -> pa.Table | None:
        """Process one micro-batch: per input that has rows in it, a table of that input's
        columns (all in the subtask's key groups, in channel order); return the output rows,
        or None. Must not keep references into *state* across calls."""

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        """Not called: an operator over several inputs receives them apart."""
        raise StateError(
            f"operator {self.uid!r} reads several inputs: it runs first in the chain of a "
            "pipeline with named inputs (Pipeline.run(sources={...}))"
        )


class RecordCoOperator(KeyedCoOperator):
    """Per-record operator over several inputs: for a row of input ``orders`` it calls
    ``process_orders(row, state)`` with the current key set, which yields output rows as dicts
    matching :attr:`output_schema`. Timers: :meth:`RecordOperator.on_timer
    <spark_ckpt.runtime.operator.RecordOperator.on_timer>`'s form, ``on_timer(key, timestamp,
    domain, state)``."""

    def process_inputs(
        self, batches: Mapping[str, pa.Table], state: StateContext
    ) -> pa.Table | None:
        out: list[dict[str, Any]] = []
        for name in self.inputs:
            batch = batches.get(name)
            if batch is None:
                continue
            method = getattr(self, f"process_{name}", None)
            if method is None:
                raise StateError(
                    f"operator {self.uid!r} has no method process_{name}(row, state) for input "
                    f"{name!r}"
                )
            key = self.keys[name]
            for row in batch.to_pylist():
                state.set_current_key(row[key])
                out.extend(method(row, state))
        return rows_of(self.output_schema, out)

    def on_timer(
        self, key: Any, timestamp: int, domain: str, state: StateContext
    ) -> Iterable[dict[str, Any]]:
        """A timer of *key* fired (see the class docstring); the default yields nothing."""
        return ()

    def on_timers(self, timers: pa.Table, state: StateContext) -> pa.Table | None:
        return rows_of(self.output_schema, fired_per_record(self, timers, state))

    @property
    def handles_timers(self) -> bool:
        return type(self).on_timer is not RecordCoOperator.on_timer
