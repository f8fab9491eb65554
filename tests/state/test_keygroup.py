"""Key-group hashing and assignment.

Oracles: a plain-Python implementation of the hash contract documented in
``spark_ckpt.state.keygroup`` (Horner fold of bytes, SplitMix64 finalizer), Flink's range formulas
re-derived as set properties, and a second Python process with another ``PYTHONHASHSEED``.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ckpt.errors import ConfigError, StateError
from spark_ckpt.state.keygroup import (
    HASH_NAME,
    KeyGroupRange,
    key_groups,
    range_for_subtask,
    subtask_for_key_group,
    subtasks_for_keys,
)

MASK = (1 << 64) - 1


def reference_hash(key: bool | int | str | bytes) -> int:
    """The documented contract, one key at a time, in plain Python."""
    if isinstance(key, bool):
        x = int(key)
    elif isinstance(key, int):
        x = key & MASK
    else:
        data = key.encode("utf-8") if isinstance(key, str) else key
        x = 0
        for byte in data:
            x = (x * 0x100000001B3 + byte + 1) & MASK
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    x ^= x >> 31
    return x


def test_hash_name_is_recorded_constant() -> None:
    assert isinstance(HASH_NAME, str) and HASH_NAME


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=50),
    st.sampled_from([1, 7, 128, 32768]),
)
def test_int_keys_follow_documented_hash(keys: list[int], max_p: int) -> None:
    got = key_groups(pa.array(keys, pa.int64()), max_p).to_pylist()
    assert got == [reference_hash(k) % max_p for k in keys]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=40), min_size=1, max_size=40), st.sampled_from([3, 128]))
def test_string_keys_follow_documented_hash(keys: list[str], max_p: int) -> None:
    expected = [reference_hash(k) % max_p for k in keys]
    assert key_groups(pa.array(keys, pa.string()), max_p).to_pylist() == expected
    assert key_groups(pa.array(keys, pa.large_string()), max_p).to_pylist() == expected


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=30))
def test_binary_keys_follow_documented_hash(keys: list[bytes]) -> None:
    expected = [reference_hash(k) % 128 for k in keys]
    assert key_groups(pa.array(keys, pa.binary()), 128).to_pylist() == expected
    assert key_groups(pa.array(keys, pa.large_binary()), 128).to_pylist() == expected


def test_bool_keys() -> None:
    got = key_groups(pa.array([True, False, True]), 128).to_pylist()
    assert got == [reference_hash(k) % 128 for k in (True, False, True)]


def test_integer_widths_agree() -> None:
    values = [0, 1, 5, 100, 127]
    expected = key_groups(pa.array(values, pa.int64()), 128).to_pylist()
    for t in (pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()):
        assert key_groups(pa.array(values, t), 128).to_pylist() == expected
    negatives = [-1, -128, -5]
    assert (
        key_groups(pa.array(negatives, pa.int8()), 128).to_pylist()
        == key_groups(pa.array(negatives, pa.int64()), 128).to_pylist()
    )


def test_slices_chunks_and_dictionaries_agree() -> None:
    keys = [f"k{i}" for i in range(100)]
    full = key_groups(pa.array(keys), 128).to_pylist()
    assert key_groups(pa.array(keys).slice(10, 30), 128).to_pylist() == full[10:40]
    chunked = pa.chunked_array([pa.array(keys[:40]), pa.array(keys[40:])])
    assert key_groups(chunked, 128).to_pylist() == full
    assert key_groups(pa.array(keys).dictionary_encode(), 128).to_pylist() == full
    assert key_groups(pa.array([], pa.string()), 128).to_pylist() == []


def test_rejects_nulls_unsupported_types_and_bad_max_parallelism() -> None:
    with pytest.raises(StateError):
        key_groups(pa.array([1, None]), 128)
    with pytest.raises(StateError):
        key_groups(pa.array([1.5]), 128)
    for bad in (0, -1, 32769):
        with pytest.raises(ConfigError):
            key_groups(pa.array([1]), bad)


_CHILD = """
import json, sys
import pyarrow as pa
from spark_ckpt.state.keygroup import key_groups
ints = list(range(-500, 500))
strs = [f"user-{i}" for i in range(1000)] + ["", "é", "日本"]
print(json.dumps({
    "ints": key_groups(pa.array(ints), 128).to_pylist(),
    "strs": key_groups(pa.array(strs), 128).to_pylist(),
    "bins": key_groups(pa.array([s.encode() for s in strs], pa.binary()), 97).to_pylist(),
    "bools": key_groups(pa.array([True, False]), 128).to_pylist(),
}))
"""


def test_stable_across_processes_with_different_hash_seeds() -> None:
    results = []
    for seed in ("1", "987654"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run(
            [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True
        )
        results.append(json.loads(out.stdout))
    assert results[0] == results[1]
    ints = list(range(-500, 500))
    strs = [f"user-{i}" for i in range(1000)] + ["", "é", "日本"]
    assert results[0]["ints"] == key_groups(pa.array(ints), 128).to_pylist()
    assert results[0]["strs"] == key_groups(pa.array(strs), 128).to_pylist()
    # different seeds would (almost surely) permute Python's own hash() of these strings
    assert results[0]["strs"] == [reference_hash(s) % 128 for s in strs]


def test_distribution_is_roughly_uniform() -> None:
    for keys in (pa.array(np.arange(128_000)), pa.array([f"user-{i}" for i in range(128_000)])):
        counts = np.bincount(np.asarray(key_groups(keys, 128)), minlength=128)
        assert counts.min() > 800 and counts.max() < 1200  # mean 1000


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 32768).flatmap(lambda m: st.tuples(st.just(m), st.integers(1, m))))
def test_ranges_partition_key_groups(mp: tuple[int, int]) -> None:
    max_p, p = mp
    ranges = [range_for_subtask(max_p, p, i) for i in range(p)] if p <= 64 else None
    sample = range(p) if ranges is not None else sorted({0, p - 1, p // 2, p // 3})
    if ranges is not None:
        assert ranges[0].start == 0 and ranges[-1].end == max_p - 1
        for a, b in itertools.pairwise(ranges):
            assert b.start == a.end + 1
        sizes = [len(r) for r in ranges]
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == max_p
    for i in sample:
        r = range_for_subtask(max_p, p, i)
        assert len(r) >= 1
        for kg in (r.start, r.end, (r.start + r.end) // 2):
            assert subtask_for_key_group(max_p, p, kg) == i
            assert kg in r
        if r.start > 0:
            assert subtask_for_key_group(max_p, p, r.start - 1) == i - 1


def test_key_group_range_api() -> None:
    r = KeyGroupRange(3, 5)
    assert list(r) == [3, 4, 5] and len(r) == 3 and 5 in r and 6 not in r
    assert r.contains_all(np.array([3, 5])) and not r.contains_all(np.array([2, 4]))
    assert r.contains_all(np.array([], dtype=np.int32))
    with pytest.raises(StateError):
        KeyGroupRange(5, 3)
    with pytest.raises(ConfigError):
        range_for_subtask(128, 129, 0)
    with pytest.raises(ConfigError):
        range_for_subtask(128, 4, 4)
    with pytest.raises(StateError):
        subtask_for_key_group(128, 4, 128)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 10**9), max_size=200), st.integers(1, 16))
def test_subtasks_for_keys_agrees_with_ranges(keys: list[int], p: int) -> None:
    arr = pa.array(keys, pa.int64())
    subtasks = subtasks_for_keys(arr, 64, p).to_pylist()
    for kg, sub in zip(key_groups(arr, 64).to_pylist(), subtasks, strict=True):
        assert kg in range_for_subtask(64, p, sub)
