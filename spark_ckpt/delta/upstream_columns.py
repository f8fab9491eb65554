"""The Delta tail source's column names: a table written by an upstream spark-ckpt pipeline
that kept its barrier columns has columns named ``_ckpt_*``, which would collide with the
downstream's own barrier columns.

Every column named ``_ckpt_*`` — or ``_upstream_ckpt_*``, ``_upstream_upstream_ckpt_*``, ...
— is renamed by prefixing ``_upstream`` (:func:`upstream_name`); every other name stays. The
renaming is injective, so chains of pipelines never collide. The upstream's barrier and
cancel rows thus pass through as ordinary data rows: the downstream aligns on its own
barriers only, and the upstream lineage (channel, offset, checkpoint id) stays queryable.
"""

from __future__ import annotations

import re
from typing import Final

#: Prefix of the barrier columns of :mod:`spark_ckpt.protocol.barrier`.
BARRIER_PREFIX: Final = "_ckpt_"
#: What :func:`upstream_name` prepends.
UPSTREAM_PREFIX: Final = "_upstream"

_UPSTREAM_COLUMN = re.compile(f"(?:{UPSTREAM_PREFIX})*{BARRIER_PREFIX}.*", re.DOTALL)


def upstream_name(name: str) -> str:
    """The source column name of table column *name*: ``_upstream`` + *name* for barrier-like
    names (``(_upstream)*_ckpt_*``), *name* itself otherwise."""
    return UPSTREAM_PREFIX + name if _UPSTREAM_COLUMN.fullmatch(name) else name
