"""Option values: the validators every layer uses to check a user's setting.

A bad value raises :class:`~spark_ckpt.errors.ConfigError` naming the option, the value and
what was expected, before anything runs.
"""

from __future__ import annotations

import re
from typing import Final

from spark_ckpt.errors import ConfigError

_INT_RE: Final = re.compile(r"[+-]?[0-9]+")

#: Largest duration or count accepted (Java ``Long.MAX_VALUE``; fits Arrow ``int64``).
MAX_LONG: Final = 2**63 - 1


def check_int(
    option: str, value: object, minimum: int, maximum: int = MAX_LONG, *, unit: str = ""
) -> int:
    """Return *value* if it is an ``int`` (not a ``bool``) in ``[minimum, maximum]``; raise
    :class:`ConfigError` naming *option* otherwise. *unit* (e.g. ``"ms"``) is named in the
    message. Shared by the config validators."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        what = f"an integer number of {unit}" if unit else "an integer"
        upper = f" and <= {maximum}" if maximum != MAX_LONG else ""
        raise ConfigError(option, value, f"{what} >= {minimum}{upper}")
    return value


def parse_int(option: str, text: str) -> int:
    """A decimal integer option value (an optional sign and digits, surrounding blanks
    ignored); :class:`ConfigError` naming *option* otherwise. The one integer parser of
    option text."""
    stripped = text.strip()
    if _INT_RE.fullmatch(stripped) is None:
        raise ConfigError(option, text, "an integer")
    return int(stripped)
