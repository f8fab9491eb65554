"""Tests of :mod:`spark_ckpt.sources.generator`: replay determinism, the documented formulas
(checked
against a plain-Python reimplementation), key ranges and skew, availability, options."""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt.errors import ConfigError, ProtocolError
from spark_ckpt.sources.generator import (
    AMOUNT_MAX,
    DEFAULT_EPOCH_MS,
    GENERATOR_SCHEMA,
    GeneratorSpec,
)

MASK = 2**64 - 1
GOLDEN = 0x9E3779B97F4A7C15
STREAM_SALT = 0x5C4B_2D1E_0F3A_6978


def ref_mix64(z: int) -> int:
    """SplitMix64 finalizer, written independently of the module under test."""
    z &= MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def ref_row(spec: GeneratorSpec, channel: int, offset: int) -> dict[str, int]:
    """One row by the formulas of the module docstring, in plain Python integers/floats."""
    stream = ref_mix64(spec.seed + ref_mix64(channel + STREAM_SALT))
    key_draw = ref_mix64(stream + (2 * offset + 1) * GOLDEN)
    amount_draw = ref_mix64(stream + (2 * offset + 2) * GOLDEN)
    u = (key_draw >> 11) / 2**53
    k = spec.key_cardinality
    if spec.key_skew == 0:
        user_id = min(math.floor(u * k), k - 1)
    else:
        weights = [(i + 1) ** -spec.key_skew for i in range(k)]
        total = math.fsum(weights)
        cdf, acc = [], 0.0
        for w in weights:
            acc += w
            cdf.append(acc / total)
        user_id = min(bisect.bisect_right(cdf, u), k - 1)
    rate = spec.rows_per_second
    spacing_us = 1e6 / rate if rate > 0 else 1000.0
    backlog = spec.backlogs[channel]
    event_us = spec.epoch_ms * 1000 + math.floor((offset - backlog + 1) * spacing_us)
    return {"user_id": user_id, "amount": 1 + amount_draw % AMOUNT_MAX, "event_us": event_us}


def as_plain(table: pa.Table) -> list[dict[str, int]]:
    ts = table.column("event_ts").cast(pa.int64()).to_pylist()
    return [
        {"user_id": u, "amount": a, "event_us": t}
        for u, a, t in zip(
            table.column("user_id").to_pylist(), table.column("amount").to_pylist(), ts, strict=True
        )
    ]


specs = st.builds(
    GeneratorSpec,
    seed=st.integers(0, 2**63 - 1),
    channels=st.integers(1, 4),
    rows_per_second=st.sampled_from([0.0, 1.0, 250.0, 1000.0, 33.3]),
    backlog=st.integers(0, 500),
    key_cardinality=st.integers(1, 50),
    key_skew=st.sampled_from([0.0, 0.5, 1.2]),
)


@settings(max_examples=60, deadline=None)
@given(spec=specs, data=st.data())
def test_any_split_of_a_range_concatenates_to_the_same_rows(
    spec: GeneratorSpec, data: st.DataObject
) -> None:
    channel = data.draw(st.integers(0, spec.channels - 1))
    start = data.draw(st.integers(0, 10_000))
    length = data.draw(st.integers(0, 300))
    end = start + length
    cuts = sorted(data.draw(st.lists(st.integers(start, end), max_size=6)))
    bounds = [start, *cuts, end]
    pieces = [spec.rows(channel, a, b) for a, b in itertools.pairwise(bounds)]
    whole = spec.rows(channel, start, end)
    assert pa.concat_tables(pieces).equals(whole)
    # ... and an equal spec built independently regenerates the same rows
    twin = GeneratorSpec(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)})
    assert twin.rows(channel, start, end).equals(whole)


@pytest.mark.parametrize("skew", [0.0, 1.3])
def test_rows_follow_the_documented_formulas(skew: float) -> None:
    spec = GeneratorSpec(
        seed=123456789, channels=3, rows_per_second=40.0, backlog=(7, 0, 2), key_skew=skew
    )
    for channel in range(3):
        got = as_plain(spec.rows(channel, 995, 1025))
        assert got == [ref_row(spec, channel, o) for o in range(995, 1025)]


def test_schema_and_empty_range() -> None:
    spec = GeneratorSpec(seed=1, channels=2, rows_per_second=10)
    assert spec.rows(0, 0, 10).schema.equals(GENERATOR_SCHEMA)
    empty = spec.rows(1, 5, 5)
    assert empty.num_rows == 0 and empty.schema.equals(GENERATOR_SCHEMA)
    assert spec.rows(1, 0, 10).column("amount").null_count == 0


def test_channels_and_seeds_produce_different_rows() -> None:
    spec = GeneratorSpec(seed=5, channels=3, rows_per_second=100, key_cardinality=1_000_000)
    ids = [tuple(spec.rows(c, 0, 200).column("user_id").to_pylist()) for c in range(3)]
    assert len(set(ids)) == 3
    other = GeneratorSpec(seed=6, channels=3, rows_per_second=100, key_cardinality=1_000_000)
    assert other.rows(0, 0, 200).column("user_id").to_pylist() != list(ids[0])


@settings(max_examples=30, deadline=None)
@given(
    cardinality=st.integers(1, 2000),
    skew=st.sampled_from([0.0, 0.8, 2.5]),
    seed=st.integers(0, 2**63 - 1),
)
def test_keys_and_amounts_stay_in_range(cardinality: int, skew: float, seed: int) -> None:
    spec = GeneratorSpec(
        seed=seed, channels=1, rows_per_second=1, key_cardinality=cardinality, key_skew=skew
    )
    table = spec.rows(0, 0, 2000)
    assert all(0 <= k < cardinality for k in table.column("user_id").to_pylist())
    assert all(1 <= a <= AMOUNT_MAX for a in table.column("amount").to_pylist())


def test_uniform_keys_are_roughly_uniform() -> None:
    n, k = 100_000, 100
    spec = GeneratorSpec(seed=11, channels=1, rows_per_second=1, key_cardinality=k)
    counts = Counter(spec.rows(0, 0, n).column("user_id").to_pylist())
    assert set(counts) == set(range(k))
    expected = n / k  # 1000, standard deviation ~31
    assert all(0.7 * expected < c < 1.3 * expected for c in counts.values())


def test_skew_makes_the_hottest_key_far_more_frequent_than_uniform() -> None:
    n, k = 100_000, 1000
    spec = GeneratorSpec(seed=11, channels=1, rows_per_second=1, key_cardinality=k, key_skew=1.2)
    counts = Counter(spec.rows(0, 0, n).column("user_id").to_pylist())
    top_key, top_count = counts.most_common(1)[0]
    assert top_key == 0
    assert top_count > 20 * n / k  # law gives ~20% of rows (~200x uniform); keep a wide margin
    assert counts[0] > counts[1] > counts[10] > counts[100]


def test_available_grows_with_rate_from_the_per_channel_backlog() -> None:
    spec = GeneratorSpec(seed=0, channels=3, rows_per_second=250.0, backlog=(1000, 0, 10))
    assert [spec.available(c, 0) for c in range(3)] == [1000, 0, 10]
    assert spec.available(1, 3) == 0  # 0.75 rows
    assert spec.available(1, 4) == 1
    assert spec.available(2, 10_000) == 10 + 2500
    assert spec.available(0, -50) == 1000
    values = [spec.available(1, t) for t in range(0, 5000, 7)]
    assert values == sorted(values)


def test_event_ts_is_the_instant_a_row_became_available() -> None:
    spec = GeneratorSpec(seed=3, channels=2, rows_per_second=333.0, backlog=(0, 50))
    for channel in range(2):
        for elapsed_ms in (0, 1, 2, 3, 17, 1000, 12_345):
            n = spec.available(channel, elapsed_ms)
            if n == 0:
                continue
            last_us = spec.rows(channel, n - 1, n).column("event_ts").cast(pa.int64())[0].as_py()
            assert last_us <= (DEFAULT_EPOCH_MS + elapsed_ms) * 1000 + 1  # 1 µs float slack
    stamps = spec.rows(1, 0, 500).column("event_ts").cast(pa.int64()).to_pylist()
    assert stamps == sorted(stamps)


def test_zero_rate_means_backlog_only() -> None:
    spec = GeneratorSpec(seed=0, channels=1, rows_per_second=0, backlog=42)
    assert spec.available(0, 10**9) == 42
    stamps = spec.rows(0, 40, 44).column("event_ts").cast(pa.int64()).to_pylist()
    assert [b - a for a, b in itertools.pairwise(stamps)] == [1000, 1000, 1000]


def test_bad_channel_or_range_is_a_protocol_error() -> None:
    spec = GeneratorSpec(seed=0, channels=2, rows_per_second=1)
    with pytest.raises(ProtocolError, match="unknown channel 2"):
        spec.rows(2, 0, 1)
    with pytest.raises(ProtocolError):
        spec.rows(0, 5, 4)
    with pytest.raises(ProtocolError):
        spec.rows(0, -1, 4)
    with pytest.raises(ProtocolError):
        spec.available(-1, 0)


def test_from_options_parses_keys_case_insensitively_and_ignores_others() -> None:
    spec = GeneratorSpec.from_options(
        {
            "Seed": "42",
            "CHANNELS": "3",
            "rate": "12.5",
            "backlog": "10, 0,5",
            "keys": "77",
            "skew": "0.9",
            "checkpoint.interval": "10s",
        }
    )
    assert spec == GeneratorSpec(
        seed=42,
        channels=3,
        rows_per_second=12.5,
        backlog=(10, 0, 5),
        key_cardinality=77,
        key_skew=0.9,
    )
    assert GeneratorSpec.from_options({}) == GeneratorSpec(seed=0, channels=1, rows_per_second=1000)
    assert GeneratorSpec.from_options({"channels": "2", "backlog": "9"}).backlogs == (9, 9)
    assert GeneratorSpec.from_options(spec.to_options()) == spec


@pytest.mark.parametrize(
    ("options", "bad"),
    [
        ({"seed": "x"}, "seed"),
        ({"seed": "-1"}, "seed"),
        ({"channels": "0"}, "channels"),
        ({"channels": "2.5"}, "channels"),
        ({"rate": "-1"}, "rate"),
        ({"rate": "nan"}, "rate"),
        ({"rate": "fast"}, "rate"),
        ({"backlog": "-3"}, "backlog"),
        ({"channels": "3", "backlog": "1,2"}, "backlog"),
        ({"backlog": "1,,2"}, "backlog"),
        ({"keys": "0"}, "keys"),
        ({"keys": "many"}, "keys"),
        ({"skew": "-0.5"}, "skew"),
        ({"skew": "inf"}, "skew"),
        ({"keys": "20000000", "skew": "1"}, "keys"),
    ],
)
def test_invalid_options_raise_config_error_naming_the_option(
    options: dict[str, str], bad: str
) -> None:
    with pytest.raises(ConfigError) as info:
        GeneratorSpec.from_options(options)
    assert info.value.option == bad
    assert repr(bad) in str(info.value)


def test_invalid_fields_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="rows_per_second"):
        GeneratorSpec(seed=0, channels=1, rows_per_second=float("inf"))
    with pytest.raises(ConfigError, match="channels"):
        GeneratorSpec(seed=0, channels=True, rows_per_second=1)
    with pytest.raises(ConfigError, match="backlog"):
        GeneratorSpec(seed=0, channels=2, rows_per_second=1, backlog=(1, 2, 3))
