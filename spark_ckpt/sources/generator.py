"""A deterministic, replayable event generator: the data behind ``ckpt-source``'s channels.

A :class:`GeneratorSpec` describes ``channels`` independent, unbounded logs. Row *o* of
channel *c* is a pure function of ``(seed, c, o)``, so any offset range can be generated
again, on any process, in any split, and comes out identical. That is what makes the
source replayable: a restored channel restarts at its barrier offset and re-reads the very
rows it had emitted before.

Availability
------------
Channel *c* starts with ``backlog[c]`` rows and gains ``rows_per_second`` rows per second:
``available(c, t_ms) = backlog[c] + floor(rows_per_second * t_ms / 1000)`` rows exist
``t_ms`` milliseconds after the stream started (negative ``t_ms`` counts as 0). A lagging
channel is one with a smaller backlog.

Columns (:data:`GENERATOR_SCHEMA`)
----------------------------------
With ``mix64`` the SplitMix64 finalizer and all arithmetic modulo 2**64::

    stream = mix64(seed + mix64(channel + STREAM_SALT))
    draw(o, j) = mix64(stream + (2*o + j + 1) * GOLDEN)        # j = 0: key, j = 1: amount
    u = (draw(o, 0) >> 11) / 2**53                             # uniform in [0, 1)

* ``user_id`` (int64, ``0 <= user_id < key_cardinality``): with ``key_skew == 0``
  ``floor(u * key_cardinality)``; otherwise the inverse CDF of the Zipf-like law
  ``P(k) ∝ 1 / (k + 1) ** key_skew``, i.e. the smallest *k* whose cumulative probability
  exceeds *u* -- key 0 is the hottest.
* ``amount`` (int64, ``1 <= amount <= AMOUNT_MAX``): ``1 + draw(o, 1) % AMOUNT_MAX``.
* ``event_ts`` (timestamp[us, UTC]): the instant row *o* became available,
  ``epoch_ms * 1000 + floor((o - backlog[c] + 1) * 1e6 / rows_per_second)`` microseconds
  (1 ms spacing when ``rows_per_second == 0``); backlog rows are stamped at or before the
  epoch.

The generated columns carry no offset or channel: ``ckpt-source`` adds the barrier columns
of :mod:`spark_ckpt.protocol.barrier`.

Pure: no I/O, no clock, no pyspark. Safe to call on the driver and on executors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from spark_ckpt.errors import ConfigError, ProtocolError
from spark_ckpt.protocol.option import check_int, parse_int
from spark_ckpt.sources.channel_source import check_channel

#: Arrow schema of :meth:`GeneratorSpec.rows`. Columns are never null.
GENERATOR_SCHEMA: Final = pa.schema(
    [
        pa.field("user_id", pa.int64(), nullable=False),
        pa.field("amount", pa.int64(), nullable=False),
        pa.field("event_ts", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)
#: Spark DDL of :data:`GENERATOR_SCHEMA`. ``NOT NULL`` matters: a Python data source's
#: ``read()`` must yield record batches whose schema (nullability included) equals the one
#: Spark derives from the DDL.
GENERATOR_DDL: Final = (
    "user_id bigint not null, amount bigint not null, event_ts timestamp not null"
)

#: Upper bound of ``amount`` (inclusive).
AMOUNT_MAX: Final = 100_000
#: Default ``epoch_ms``: 2024-01-01T00:00:00Z.
DEFAULT_EPOCH_MS: Final = 1_704_067_200_000
#: Largest ``key_cardinality`` with ``key_skew > 0`` (the inverse-CDF table holds 8 bytes per key).
MAX_SKEWED_CARDINALITY: Final = 10_000_000
#: Largest offset :meth:`GeneratorSpec.rows` accepts (exclusive end).
MAX_OFFSET: Final = 2**62

GOLDEN: Final = 0x9E3779B97F4A7C15
STREAM_SALT: Final = 0x5C4B_2D1E_0F3A_6978
_MASK: Final = 2**64 - 1
_M1: Final = 0xBF58476D1CE4E5B9
_M2: Final = 0x94D049BB133111EB
_MAX_SEED: Final = 2**63 - 1
_MAX_CHANNELS: Final = 2**31 - 1

_U64 = npt.NDArray[np.uint64]


def _mix64_int(z: int) -> int:
    """SplitMix64 finalizer on a Python int (modulo 2**64)."""
    z &= _MASK
    z = ((z ^ (z >> 30)) * _M1) & _MASK
    z = ((z ^ (z >> 27)) * _M2) & _MASK
    return z ^ (z >> 31)


def _mix64(z: _U64) -> _U64:
    """SplitMix64 finalizer, elementwise on a uint64 array (wrapping arithmetic)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(_M1)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(_M2)
    return z ^ (z >> np.uint64(31))


@lru_cache(maxsize=8)
def _zipf_cdf(cardinality: int, skew: float) -> npt.NDArray[np.float64]:
    """Cumulative probabilities of ``P(k) ∝ (k + 1) ** -skew``, last entry exactly 1."""
    weights = np.arange(1, cardinality + 1, dtype=np.float64) ** -skew
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    cdf[-1] = 1.0
    cdf.flags.writeable = False
    return cdf


def _check_float(option: str, value: object, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(option, value, f"a finite number >= {minimum}")
    number = float(value)
    if not math.isfinite(number) or number < minimum:
        raise ConfigError(option, value, f"a finite number >= {minimum}")
    return number


@dataclass(frozen=True)
class GeneratorSpec:
    """The generator's parameters; frozen, validated, picklable (ship it to executors).

    ``backlog`` is one row count for every channel or a tuple with one count per channel;
    it is normalised to the tuple form, so ``GeneratorSpec(..., backlog=5)`` equals
    ``GeneratorSpec(..., backlog=(5, 5))`` for two channels. Invalid values raise
    :class:`ConfigError` naming the field.
    """

    seed: int
    channels: int
    rows_per_second: float
    backlog: int | tuple[int, ...] = 0
    key_cardinality: int = 1000
    key_skew: float = 0.0
    epoch_ms: int = DEFAULT_EPOCH_MS

    def __post_init__(self) -> None:
        check_int("seed", self.seed, 0, _MAX_SEED)
        check_int("channels", self.channels, 1, _MAX_CHANNELS)
        rate = _check_float("rows_per_second", self.rows_per_second, 0.0)
        if isinstance(self.backlog, tuple):
            if len(self.backlog) != self.channels:
                raise ConfigError(
                    "backlog", self.backlog, f"one row count or exactly {self.channels} counts"
                )
            backlog = tuple(check_int("backlog", b, 0, MAX_OFFSET) for b in self.backlog)
        else:
            backlog = (check_int("backlog", self.backlog, 0, MAX_OFFSET),) * self.channels
        check_int("key_cardinality", self.key_cardinality, 1, _MAX_SEED)
        skew = _check_float("key_skew", self.key_skew, 0.0)
        if skew > 0 and self.key_cardinality > MAX_SKEWED_CARDINALITY:
            raise ConfigError(
                "key_cardinality",
                self.key_cardinality,
                f"at most {MAX_SKEWED_CARDINALITY} keys when key_skew > 0",
            )
        check_int("epoch_ms", self.epoch_ms, 0, 2**53)
        object.__setattr__(self, "rows_per_second", rate)
        object.__setattr__(self, "backlog", backlog)
        object.__setattr__(self, "key_skew", skew)

    # --- options ---------------------------------------------------------------------------

    #: Option keys understood by :meth:`from_options` (lower case).
    OPTION_KEYS: ClassVar[tuple[str, ...]] = ("seed", "channels", "rate", "backlog", "keys", "skew")

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> GeneratorSpec:
        """Build a spec from Spark-style string options (keys matched case-insensitively;
        keys other than :attr:`OPTION_KEYS` are ignored, they belong to other subsystems).

        ======== ============================================== =======
        key      value                                          default
        ======== ============================================== =======
        seed     integer in 0..2**63-1                          0
        channels integer >= 1                                   1
        rate     rows per second per channel, number >= 0       1000
        backlog  rows per channel at start: ``n`` or ``n,m,…``  0
                 (one count per channel)
        keys     key cardinality, integer >= 1                  1000
        skew     Zipf exponent, number >= 0 (0 = uniform)       0
        ======== ============================================== =======

        Any invalid value raises :class:`ConfigError` naming the option key.
        """
        opts = {str(k).lower(): v for k, v in options.items()}

        def text(key: str, default: str) -> str:
            value = opts.get(key, default)
            if not isinstance(value, str):
                raise ConfigError(key, value, "a string")
            return value.strip()

        seed = parse_int("seed", text("seed", "0"))
        channels = parse_int("channels", text("channels", "1"))
        rate = _parse_float("rate", text("rate", "1000"))
        backlog_parts = text("backlog", "0").split(",")
        backlog_values = tuple(parse_int("backlog", part) for part in backlog_parts)
        keys = parse_int("keys", text("keys", "1000"))
        skew = _parse_float("skew", text("skew", "0"))
        backlog: int | tuple[int, ...] = (
            backlog_values[0] if len(backlog_values) == 1 else backlog_values
        )
        renames = {
            "rows_per_second": "rate",
            "key_cardinality": "keys",
            "key_skew": "skew",
        }
        try:
            return cls(
                seed=seed,
                channels=channels,
                rows_per_second=rate,
                backlog=backlog,
                key_cardinality=keys,
                key_skew=skew,
            )
        except ConfigError as e:
            option = renames.get(e.option, e.option)
            value = opts.get(option, e.value)
            raise ConfigError(option, value, e.accepted) from e

    def to_options(self) -> dict[str, str]:
        """The :meth:`from_options` form; ``from_options(s.to_options()) == s`` when
        ``epoch_ms`` has its default."""
        return {
            "seed": str(self.seed),
            "channels": str(self.channels),
            "rate": repr(self.rows_per_second),
            "backlog": ",".join(str(b) for b in self.backlogs),
            "keys": str(self.key_cardinality),
            "skew": repr(self.key_skew),
        }

    # --- availability ----------------------------------------------------------------------

    @property
    def backlogs(self) -> tuple[int, ...]:
        """Initial rows per channel (the normalised ``backlog``)."""
        assert isinstance(self.backlog, tuple)
        return self.backlog

    def available(self, channel: int, elapsed_ms: int) -> int:
        """Rows of *channel* that exist ``elapsed_ms`` after the stream started: offsets
        ``[0, available)`` may be read. Monotone non-decreasing in ``elapsed_ms``; negative
        ``elapsed_ms`` counts as 0."""
        channel = check_channel(channel, self.channels, "the generator")
        grown = math.floor(self.rows_per_second * max(elapsed_ms, 0) / 1000)
        return self.backlogs[channel] + grown

    # --- rows ------------------------------------------------------------------------------

    def rows(self, channel: int, start: int, end: int) -> pa.Table:
        """Rows ``[start, end)`` of *channel* as a table of :data:`GENERATOR_SCHEMA`.

        A pure function of ``(spec, channel, offset)`` per row: for any ``start <= m <= end``,
        ``concat(rows(c, start, m), rows(c, m, end)) == rows(c, start, end)``. It does not
        look at availability (rows beyond :meth:`available` are generated all the same).
        Raises :class:`ProtocolError` for an unknown channel or a range outside
        ``0 <= start <= end <= MAX_OFFSET``.
        """
        channel = check_channel(channel, self.channels, "the generator")
        if not 0 <= start <= end <= MAX_OFFSET:
            raise ProtocolError(
                f"bad row range [{start}, {end}) of channel {channel}: "
                f"need 0 <= start <= end <= {MAX_OFFSET}"
            )
        offsets = np.arange(start, end, dtype=np.uint64)
        stream = np.uint64(_mix64_int(self.seed + _mix64_int(channel + STREAM_SALT)))
        counter = offsets * np.uint64(2) + np.uint64(1)
        key_draw = _mix64(stream + counter * np.uint64(GOLDEN))
        amount_draw = _mix64(stream + (counter + np.uint64(1)) * np.uint64(GOLDEN))

        uniform = (key_draw >> np.uint64(11)).astype(np.float64) * 2.0**-53
        if self.key_skew == 0:
            user_id = np.minimum(
                (uniform * self.key_cardinality).astype(np.int64), self.key_cardinality - 1
            )
        else:
            cdf = _zipf_cdf(self.key_cardinality, self.key_skew)
            user_id = np.minimum(
                np.searchsorted(cdf, uniform, side="right"), self.key_cardinality - 1
            ).astype(np.int64)
        amount = (amount_draw % np.uint64(AMOUNT_MAX)).astype(np.int64) + 1

        spacing_us = 1e6 / self.rows_per_second if self.rows_per_second > 0 else 1000.0
        since_epoch = offsets.astype(np.int64) - (self.backlogs[channel] - 1)
        event_us = np.floor(since_epoch * spacing_us).astype(np.int64) + self.epoch_ms * 1000

        return pa.Table.from_arrays(
            [
                pa.array(user_id, pa.int64()),
                pa.array(amount, pa.int64()),
                pa.array(event_us, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            ],
            schema=GENERATOR_SCHEMA,
        )


def _parse_float(option: str, text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError as e:
        raise ConfigError(option, text, "a finite number") from e
    if not math.isfinite(value):
        raise ConfigError(option, text, "a finite number")
    return value


@dataclass(frozen=True)
class GeneratorReadPlan:
    """Rows ``[start, end)`` of one generator channel; picklable, read on executors."""

    spec: GeneratorSpec
    channel: int
    start: int
    end: int

    def read(self) -> pa.Table:
        return self.spec.rows(self.channel, self.start, self.end)


class GeneratorSource:
    """A :class:`~spark_ckpt.sources.channel_source.ChannelSource` over a :class:`GeneratorSpec`.

    Heads grow with the time since this object was created (the source runner's start):
    ``available(c, t)`` on a fresh stream; a restored stream (:meth:`resume_from`) keeps
    producing from its resume positions at the same rate, so a restart neither loses produced
    rows nor pauses production."""

    def __init__(self, spec: GeneratorSpec, now_ms: Callable[[], int]) -> None:
        self.spec = spec
        self._now_ms = now_ms
        self._started = now_ms()
        self._floor = [0] * spec.channels

    @property
    def channels(self) -> int:
        return self.spec.channels

    @property
    def schema(self) -> pa.Schema:
        return GENERATOR_SCHEMA

    def resume_from(self, positions: Sequence[int]) -> None:
        self._floor = [max(f, p) for f, p in zip(self._floor, positions, strict=True)]

    def heads(self) -> list[int]:
        elapsed = self._now_ms() - self._started
        produced = int(self.spec.rows_per_second * max(0, elapsed) / 1000)
        return [
            max(self._floor[c] + produced, self.spec.available(c, elapsed))
            for c in range(self.spec.channels)
        ]

    def plan(self, channel: int, start: int, end: int) -> GeneratorReadPlan:
        return GeneratorReadPlan(self.spec, channel, start, end)
