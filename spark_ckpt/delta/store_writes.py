"""What the checkpoint store's writes are made of: the rows of an append (:func:`rows_table`),
the ``IN`` predicates of a delete (:func:`sql_list`, in :func:`chunks`), and the commit
properties of a commit that must land on the snapshot it read (:func:`no_rebase`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa
from deltalake import CommitProperties

_T = TypeVar("_T")

#: Largest number of values in one ``IN (...)`` delete predicate.
_PREDICATE_CHUNK = 500


def rows_table(schema: pa.Schema, columns: Mapping[str, list[Any]]) -> pa.Table:
    """A table of *schema*; columns not given are null."""
    n = len(next(iter(columns.values())))
    arrays = [
        pa.array(columns[f.name], type=f.type) if f.name in columns else pa.nulls(n, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def no_rebase() -> CommitProperties:
    """Commit exactly on the snapshot read: a concurrent commit makes ours fail."""
    return CommitProperties(max_commit_retries=0)


def sql_list(values: Iterable[int | str]) -> str:
    """``(v1, v2, ...)`` for a SQL ``IN``; strings must be SQL-safe (hex ids only here)."""
    return "(" + ", ".join(str(v) if isinstance(v, int) else f"'{v}'" for v in values) + ")"


def chunks(values: Sequence[_T], size: int = _PREDICATE_CHUNK) -> Iterator[Sequence[_T]]:
    """*values* in slices of at most *size* (one ``IN (...)`` predicate each)."""
    for i in range(0, len(values), size):
        yield values[i : i + size]
