"""Durations: the helpers that spell them (``seconds(10)``) and the parser of their text
form (``"10 s"``, ``"1min"``), all in milliseconds."""

from __future__ import annotations

import re
from typing import Final

from spark_ckpt.errors import ConfigError
from spark_ckpt.protocol.option import MAX_LONG


def milliseconds(n: int) -> int:
    return n


def seconds(n: int) -> int:
    return n * 1000


def minutes(n: int) -> int:
    return n * 60_000


def hours(n: int) -> int:
    return n * 3_600_000


def days(n: int) -> int:
    return n * 86_400_000


#: Unit label (lower case) -> milliseconds, Flink's ``TimeUtils`` labels without sub-ms units.
_UNITS: Final[dict[str, int]] = {
    **dict.fromkeys(("ms", "milli", "millis", "millisecond", "milliseconds"), 1),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1000),
    **dict.fromkeys(("m", "min", "minute", "minutes"), 60_000),
    **dict.fromkeys(("h", "hour", "hours"), 3_600_000),
    **dict.fromkeys(("d", "day", "days"), 86_400_000),
}
_DURATION_RE: Final = re.compile(r"([0-9]+)\s*([a-z]*)")
DURATION_FORMS: Final = (
    "a non-negative whole duration such as '500ms', '10s', '1min', '2 h', '1d' "
    "(plain digits are milliseconds)"
)


def parse_duration(option: str, text: str) -> int:
    """Parse a duration such as ``"10s"``, ``"500ms"``, ``"1min"``, ``"2 h"``, ``"1d"`` or
    ``"250"`` (plain digits are milliseconds) into integer milliseconds.

    Units (case-insensitive, optional whitespace before the unit): ``ms``, ``milli(s)``,
    ``millisecond(s)``, ``s``, ``sec(s)``, ``second(s)``, ``m``, ``min``, ``minute(s)``,
    ``h``, ``hour(s)``, ``d``, ``day(s)``. Negative, fractional, empty or unparsable text,
    and values above 2^63-1 ms, raise :class:`ConfigError` naming *option*.
    """
    match = _DURATION_RE.fullmatch(text.strip().lower()) if isinstance(text, str) else None
    if match is None:
        raise ConfigError(option, text, DURATION_FORMS)
    digits, unit = match.groups()
    factor = _UNITS.get(unit or "ms")
    if factor is None:
        raise ConfigError(option, text, DURATION_FORMS)
    ms = int(digits) * factor
    if ms > MAX_LONG:
        raise ConfigError(option, text, f"a duration of at most {MAX_LONG} ms")
    return ms


def format_duration(ms: int) -> str:
    """Render *ms* in the largest unit that represents it exactly (``90000`` -> ``"90s"``,
    ``0`` -> ``"0ms"``); :func:`parse_duration` reads it back to the same value."""
    for unit, factor in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms and ms % factor == 0:
            return f"{ms // factor}{unit}"
    return f"{ms}ms"
