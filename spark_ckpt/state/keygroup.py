"""Key groups: how keyed state is partitioned across the subtasks of an operator.

As in Flink, every key hashes into one of ``max_parallelism`` *key groups*; a key group is
the unit of keyed state that moves when an operator is rescaled. A subtask of an operator
running at parallelism ``p`` owns one contiguous :class:`KeyGroupRange`
(Flink's ``KeyGroupRangeAssignment``)::

    start(i) = (i * max_p + p - 1) // p          # first key group of subtask i
    end(i)   = ((i + 1) * max_p - 1) // p        # last key group of subtask i, INCLUSIVE
    subtask(kg) = kg * p // max_p

The hash is a stable contract, recorded in every keyed snapshot as :data:`HASH_NAME`: a
snapshot taken with another hash is refused on restore. A key is first folded to a 64-bit
word ``x`` (all arithmetic modulo 2**64):

* integer keys (8 to 64 bit, signed or unsigned): their value as 64-bit two's complement, so
  ``int8``/``int32``/``int64`` keys of equal value share their key group;
* boolean keys: 1 for true, 0 for false;
* string keys (``string``/``large_string``): their UTF-8 bytes, and binary keys
  (``binary``/``large_binary``): their bytes ``b[0..L)``, folded by Horner's rule
  ``x = 0; for each byte: x = x * 0x100000001B3 + (byte + 1)``;

then ``x`` goes through the SplitMix64 finalizer (``x ^= x >> 30; x *= 0xBF58476D1CE4E5B9;
x ^= x >> 27; x *= 0x94D049BB133111EB; x ^= x >> 31``) — the same mix as
``pandas.util.hash_array``, so integer hashes equal ``hash_array`` of the ``int64`` values — and
the key group is ``x % max_parallelism``. The fold of strings is computed over the Arrow
buffers with numpy (prefix sums of ``(byte + 1) * M**exponent``), never through Python
objects, and never with Python's ``hash()`` (salted per process by ``PYTHONHASHSEED``): every
process on every machine agrees. Null keys are refused with
:class:`~spark_ckpt.errors.StateError`.

Everything here is pure and vectorized; it runs wherever records are routed or state is
restored (driver, executors, tests).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from spark_ckpt.errors import ConfigError, StateError

#: Name of the key-group hash function; recorded in snapshot schemas (see module docstring).
HASH_NAME = "splitmix64-fold-v1"

#: Default number of key groups (Flink's default for small jobs).
DEFAULT_MAX_PARALLELISM = 128

#: Upper bound of ``max_parallelism`` (as in Flink); key groups fit in an ``int16``.
UPPER_BOUND_MAX_PARALLELISM = 1 << 15


def is_supported_key_type(key_type: pa.DataType) -> bool:
    """Whether keys of *key_type* can be hashed into key groups."""
    return bool(
        pa.types.is_integer(key_type)
        or pa.types.is_boolean(key_type)
        or pa.types.is_string(key_type)
        or pa.types.is_large_string(key_type)
        or pa.types.is_binary(key_type)
        or pa.types.is_large_binary(key_type)
    )


def check_max_parallelism(max_parallelism: int) -> None:
    """Raise :class:`ConfigError` unless ``1 <= max_parallelism <= 32768``."""
    if not 1 <= max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        raise ConfigError(
            "max_parallelism", max_parallelism, f"an integer in [1, {UPPER_BOUND_MAX_PARALLELISM}]"
        )


def check_parallelism(max_parallelism: int, parallelism: int) -> None:
    """Raise :class:`ConfigError` unless ``1 <= parallelism <= max_parallelism``."""
    check_max_parallelism(max_parallelism)
    if not 1 <= parallelism <= max_parallelism:
        raise ConfigError(
            "parallelism", parallelism, f"an integer in [1, max_parallelism={max_parallelism}]"
        )


def _splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """SplitMix64 finalizer, in place (wrapping uint64 arithmetic)."""
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


_MULTIPLIER = np.uint64(0x100000001B3)
#: _POWERS[k] = _MULTIPLIER ** k mod 2**64; grown on demand (replaced, never mutated).
_POWERS: npt.NDArray[np.uint64] = np.cumprod(
    np.concatenate([[np.uint64(1)], np.full(256, _MULTIPLIER, dtype=np.uint64)]), dtype=np.uint64
)


def _powers(n: int) -> npt.NDArray[np.uint64]:
    """At least *n* powers of the multiplier."""
    global _POWERS
    table = _POWERS
    if len(table) < n:
        size = max(n, 2 * len(table))
        steps = np.full(size - len(table), _MULTIPLIER, dtype=np.uint64)
        steps[:1] *= table[-1:]  # array op: wraps silently
        table = np.concatenate([table, np.cumprod(steps, dtype=np.uint64)])
        _POWERS = table
    return table


def _fold_bytes(arr: pa.Array) -> npt.NDArray[np.uint64]:
    """Horner fold ``x = x * M + (byte + 1)`` of every value of a (large_)string/binary
    array, vectorized: ``x = sum((b[i] + 1) * M**(L - 1 - i))`` via one prefix sum."""
    n = len(arr)
    offset_type = np.int64 if arr.type in (pa.large_string(), pa.large_binary()) else np.int32
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], dtype=offset_type)[arr.offset : arr.offset + n + 1]
    offsets = offsets.astype(np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    if n == 0 or last == first:
        return np.zeros(n, dtype=np.uint64)
    data = np.frombuffer(buffers[2], dtype=np.uint8)[first:last]
    lengths = np.diff(offsets)
    # exponent of each byte: distance to the last byte of its value
    exponent = np.repeat(offsets[1:] - 1, lengths)
    exponent -= np.arange(first, last, dtype=np.int64)
    terms = _powers(int(lengths.max()))[exponent]
    terms *= data.astype(np.uint64) + np.uint64(1)
    prefix = np.empty(len(terms) + 1, dtype=np.uint64)
    prefix[0] = 0
    np.cumsum(terms, dtype=np.uint64, out=prefix[1:])
    relative = offsets - first
    result: npt.NDArray[np.uint64] = prefix[relative[1:]] - prefix[relative[:-1]]
    return result


def key_hashes(keys: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.uint64]:
    """The 64-bit key hash of every key (see module docstring), as a numpy array."""
    arr = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if arr.null_count:
        raise StateError(f"{arr.null_count} null key(s): keys of keyed state must not be null")
    t = arr.type
    folded: npt.NDArray[np.uint64]
    if pa.types.is_integer(t):
        wide = arr.cast(pa.int64() if pa.types.is_signed_integer(t) else pa.uint64())
        folded = wide.to_numpy(zero_copy_only=False).view(np.uint64).copy()
    elif pa.types.is_boolean(t):
        folded = arr.to_numpy(zero_copy_only=False).astype(np.uint64)
    elif (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    ):
        folded = _fold_bytes(arr)
    else:
        raise StateError(
            f"keys of type {t} cannot be hashed into key groups: use an integer, bool, "
            "string or binary key"
        )
    return _splitmix64(folded)


def key_group_indices(
    keys: pa.Array | pa.ChunkedArray, max_parallelism: int = DEFAULT_MAX_PARALLELISM
) -> npt.NDArray[np.int32]:
    """Key group of every key as a numpy ``int32`` array (the numpy form of
    :func:`key_groups`)."""
    check_max_parallelism(max_parallelism)
    groups = key_hashes(keys) % np.uint64(max_parallelism)
    return groups.astype(np.int32)


def key_groups(
    keys: pa.Array | pa.ChunkedArray, max_parallelism: int = DEFAULT_MAX_PARALLELISM
) -> pa.Array:
    """Key group (``int32`` in ``[0, max_parallelism)``) of every key. Deterministic across
    processes and machines; raises :class:`StateError` on nulls or unsupported key types."""
    return pa.array(key_group_indices(keys, max_parallelism), type=pa.int32())


@dataclass(frozen=True, order=True)
class KeyGroupRange:
    """The key groups ``start..end``, both ends INCLUSIVE (Flink's convention), owned by one
    subtask. Never empty: ``0 <= start <= end``."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise StateError(f"invalid key group range [{self.start}, {self.end}]")

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.start <= key_group <= self.end

    def __len__(self) -> int:
        return self.end - self.start + 1

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    def __str__(self) -> str:
        return f"[{self.start}, {self.end}]"

    def contains_all(self, key_groups: npt.NDArray[np.integer]) -> bool:
        """Whether every key group in the array lies in this range (vacuously true)."""
        if len(key_groups) == 0:
            return True
        return bool(key_groups.min() >= self.start and key_groups.max() <= self.end)


def range_for_subtask(max_parallelism: int, parallelism: int, subtask: int) -> KeyGroupRange:
    """The key groups subtask *subtask* owns at *parallelism* (Flink's
    ``computeKeyGroupRangeForOperatorIndex``)."""
    check_parallelism(max_parallelism, parallelism)
    if not 0 <= subtask < parallelism:
        raise ConfigError("subtask", subtask, f"an integer in [0, {parallelism})")
    start = (subtask * max_parallelism + parallelism - 1) // parallelism
    end = ((subtask + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start, end)


def subtask_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """The subtask owning *key_group* at *parallelism* (Flink's
    ``computeOperatorIndexForKeyGroup``)."""
    check_parallelism(max_parallelism, parallelism)
    if not 0 <= key_group < max_parallelism:
        raise StateError(f"key group {key_group} is outside [0, {max_parallelism})")
    return key_group * parallelism // max_parallelism


def subtasks_for_keys(
    keys: pa.Array | pa.ChunkedArray, max_parallelism: int, parallelism: int
) -> pa.Array:
    """The subtask (``int32``) each key is routed to at *parallelism*; vectorized."""
    check_parallelism(max_parallelism, parallelism)
    groups = key_group_indices(keys, max_parallelism).astype(np.int64)
    return pa.array((groups * parallelism // max_parallelism).astype(np.int32), type=pa.int32())
