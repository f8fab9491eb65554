"""The two keyed stages of ``spark-ckpt demo --job stages`` and their oracle, a plain fold over
the input: per-user running totals, then, re-keyed by country, per-country running counts."""

from __future__ import annotations

from collections import Counter

from spark_ckpt import RunningCount, Stage
from spark_ckpt.demo import COUNTRIES, UserTotals


def two_stages(users: int | None = 2, countries: int | None = 2, **more: object) -> list[Stage]:
    """The job: users, then countries (parallelism of each; None: the job's)."""
    return [
        Stage(UserTotals(), name="users", parallelism=users, **more),  # type: ignore[arg-type]
        Stage(
            RunningCount("countries", "country"),
            name="countries",
            parallelism=countries,
            max_parallelism=32,  # a stage's own (the job's is the configuration's, 128)
        ),
    ]


def expected(
    user_ids: list[int], amounts: list[int]
) -> tuple[Counter[tuple[int, int]], Counter[tuple[int, int]]]:
    """The oracle: the (user, running total) rows, and the (country, running count) rows."""
    totals: Counter[int] = Counter()
    per_country: Counter[int] = Counter()
    users: Counter[tuple[int, int]] = Counter()
    countries: Counter[tuple[int, int]] = Counter()
    for user, amount in zip(user_ids, amounts, strict=True):
        totals[user] += amount
        users[(user, totals[user])] += 1
        per_country[user % COUNTRIES] += 1
        countries[(user % COUNTRIES, per_country[user % COUNTRIES])] += 1
    return users, countries
