"""The two-stage job of the graphs bench (:mod:`runbench.graphbench`, issue 51): per-user
counts, then, re-keyed by country, per-country sums over tumbling event-time windows — the
operator code of both sides and the oracle, with nothing of the bench imported, since both
sides ship this module by value to Python workers that cannot import ``bench/``:

* :class:`UserCounts` — spark-ckpt's first stage (``Stage([UserCounts()], name="users")``):
  per ``user_id`` the running count of its rows; one row per input row, carrying the user's
  ``country`` (``user_id % COUNTRIES``), ``amount`` and ``event_ts`` for the second stage,
  ``WindowAggregate("countries", "country", Windows.tumbling(WINDOW_MS), [Agg.sum("amount")],
  time_column="event_ts")``. Vectorized: one sort per batch (as ``spark_ckpt.demo.UserTotals``);
* :func:`count_users` — the same first stage as Spark's ``applyInPandasWithState`` function
  (output :data:`USERS_DDL`, state :data:`STATE_DDL`, append mode, no timeout): called once
  per user per micro-batch with that user's rows, as Spark's API goes;
* :func:`window_sums` — the oracle of the second stage: a pandas fold over the generated rows
  (tumbling windows of :data:`WINDOW_MS` aligned to the epoch, ``[start, end)``).

Both jobs write :data:`OUTPUT_COLUMNS`: ``country, window_start, window_end, sum_amount``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import numpy as np
import pandas as pd
import pyarrow as pa

from spark_ckpt.runtime.operator import KeyedOperator, rank_within_key
from spark_ckpt.state.context import StateContext
from spark_ckpt.state.descriptor import ValueStateDescriptor

#: Countries: a user's country is ``user_id % COUNTRIES``.
COUNTRIES: Final = 50
#: The second stage's tumbling windows, ms.
WINDOW_MS: Final = 5_000
#: The columns of both jobs' output (the second stage's rows).
OUTPUT_COLUMNS: Final = ("country", "window_start", "window_end", "sum_amount")
#: Spark's first stage: its output rows and its per-user state (DDL).
USERS_DDL: Final = "user_id long, country long, amount long, event_ts timestamp, count long"
STATE_DDL: Final = "count long"

#: :class:`UserCounts`' output rows.
USER_ROWS: Final = pa.schema(
    [
        ("user_id", pa.int64()),
        ("country", pa.int64()),
        ("amount", pa.int64()),
        ("event_ts", pa.timestamp("us", tz="UTC")),
        ("count", pa.int64()),
    ]
)


class UserCounts(KeyedOperator):
    """Per ``user_id``, the running count of its rows (this one included), one output row per
    input row with the user's ``country``, ``amount`` and ``event_ts`` (see the module
    docstring). State: one int64 per user."""

    COUNT = ValueStateDescriptor("count", pa.int64())

    def __init__(self, uid: str = "users", countries: int = COUNTRIES) -> None:
        super().__init__(uid, "user_id", pa.int64())
        self.countries = countries

    @property
    def output_schema(self) -> pa.Schema:
        return USER_ROWS

    def open(self, state: StateContext) -> None:
        state.value_state(self.COUNT)

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        if batch.num_rows == 0:
            return None
        keys = batch.column("user_id").cast(pa.int64())
        distinct, codes, rank = rank_within_key(keys)
        before = state.get_values(self.COUNT, distinct).fill_null(0).to_numpy(zero_copy_only=False)
        sizes = np.bincount(codes, minlength=len(distinct))
        state.put_values(self.COUNT, distinct, pa.array(before + sizes, pa.int64()))
        users = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
        countries = users.to_numpy(zero_copy_only=False) % self.countries
        return pa.table(
            [
                users,
                pa.array(countries, pa.int64()),
                batch.column("amount").cast(pa.int64()),
                batch.column("event_ts").cast(USER_ROWS.field("event_ts").type),
                pa.array(before[codes] + rank + 1, pa.int64()),
            ],
            schema=USER_ROWS,
        )


def count_users(
    key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any
) -> Iterator[pd.DataFrame]:
    """Spark's first stage (``applyInPandasWithState``): the user *key*'s rows of one
    micro-batch, *frames*, each with its running count; the count kept in *state*."""
    seen = int(state.get[0]) if state.exists else 0
    for frame in frames:
        n = len(frame)
        if n == 0:
            continue
        users = frame["user_id"].to_numpy()
        yield pd.DataFrame(
            {
                "user_id": users,
                "country": users % COUNTRIES,
                "amount": frame["amount"].to_numpy(),
                "event_ts": frame["event_ts"].reset_index(drop=True),
                "count": np.arange(seen + 1, seen + n + 1, dtype=np.int64),
            }
        )
        seen += n
    state.update((seen,))


def window_sums(rows: pa.Table, countries: int = COUNTRIES) -> pd.DataFrame:
    """The oracle of the second stage over the input *rows* (``user_id``, ``amount``,
    ``event_ts``): per country and tumbling window of :data:`WINDOW_MS`, the sum of ``amount``,
    as :data:`OUTPUT_COLUMNS` with the windows' bounds in epoch ms, sorted."""
    us = rows.column("event_ts").cast(pa.int64()).to_numpy()
    ms = np.floor_divide(us, 1000)
    start = ms - np.mod(ms, WINDOW_MS)
    frame = pd.DataFrame(
        {
            "country": rows.column("user_id").to_numpy() % countries,
            "window_start": start,
            "window_end": start + WINDOW_MS,
            "amount": rows.column("amount").to_numpy(),
        }
    )
    out = frame.groupby(["country", "window_start", "window_end"], as_index=False)["amount"].sum()
    out = out.rename(columns={"amount": "sum_amount"})
    return out.sort_values(["window_start", "country"], ignore_index=True)
