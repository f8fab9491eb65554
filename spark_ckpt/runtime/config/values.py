"""The parsers of option values (text -> typed value); each raises a
:class:`~spark_ckpt.errors.ConfigError` naming the option. Integers are parsed by
:func:`spark_ckpt.protocol.option.parse_int`, the one integer parser."""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import StrEnum
from typing import Final

from spark_ckpt.errors import ConfigError
from spark_ckpt.runtime.config.durations import DURATION_FORMS, parse_duration

_TRUE: Final = frozenset({"true", "yes", "1"})
_FALSE: Final = frozenset({"false", "no", "0"})


def parse_bool(option: str, text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ConfigError(option, text, "true/false, yes/no or 1/0 (any case)")


def parse_interval(option: str, text: str) -> int | None:
    if text.strip().lower() in ("off", "none"):
        return None
    try:
        return parse_duration(option, text)
    except ConfigError:
        raise ConfigError(option, text, f"'off', 'none' or {DURATION_FORMS}") from None


def enum_parser(enum: type[StrEnum]) -> Callable[[str, str], StrEnum]:
    def parse(option: str, text: str) -> StrEnum:
        name = re.sub(r"[-\s]", "_", text.strip()).upper()
        try:
            return enum[name]
        except KeyError:
            names = " | ".join(m.name.lower() for m in enum)
            raise ConfigError(option, text, f"{names} (any case, '-' or '_')") from None

    return parse


def parse_path(option: str, text: str) -> str:
    if not text.strip():
        raise ConfigError(option, text, "a non-empty path or URI")
    return text


RESTART_TYPES: Final[dict[str, str]] = {
    "none": "none",
    "off": "none",
    "disable": "none",
    "fixed-delay": "fixed-delay",
    "fixeddelay": "fixed-delay",
    "failure-rate": "failure-rate",
    "failurerate": "failure-rate",
}


def parse_restart_type(option: str, text: str) -> str:
    kind = RESTART_TYPES.get(text.strip().lower().replace("_", "-"))
    if kind is None:
        raise ConfigError(option, text, "none | fixed-delay | failure-rate")
    return kind


_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(?:i?b|bytes?)?\s*$", re.IGNORECASE)
_SIZE_UNITS: Final[dict[str, int]] = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_memory_size(option: str, text: str) -> int:
    """A memory size as Flink spells it (``64mb``, ``8 MB``, ``1g``, ``4096``: bytes)."""
    match = _SIZE.match(text)
    if match is None or int(match.group(1)) <= 0:
        raise ConfigError(option, text, "a positive memory size such as 64mb, 512kb or 1gb")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]


def format_memory_size(value: int) -> str:
    """The shortest exact spelling of *value* bytes (``64mb``)."""
    for unit, factor in (("tb", 1 << 40), ("gb", 1 << 30), ("mb", 1 << 20), ("kb", 1 << 10)):
        if value % factor == 0:
            return f"{value // factor}{unit}"
    return str(value)


#: Flink's spellings of ``state.backend.type`` (its pre-1.13 names too).
STATE_BACKEND_NAMES: Final[dict[str, str]] = {
    "hashmap": "hashmap",
    "heap": "hashmap",
    "filesystem": "hashmap",
    "jobmanager": "hashmap",
    "memory": "hashmap",
    "rocksdb": "rocksdb",
}


def parse_state_backend(option: str, text: str) -> str:
    name = STATE_BACKEND_NAMES.get(text.strip().lower())
    if name is None:
        raise ConfigError(option, text, "hashmap | rocksdb")
    return name
