"""Removing rows of a store table by whole data files, planned from the Delta log's file
statistics alone: :func:`removal_plan` splits the rows to remove into the data files every
row of which goes and the keys that may be in other files; :func:`remove_files` commits
``remove`` actions for the former, what a copy-on-write delete of those files would commit.
Neither reads or writes a data file: each reads the table's add actions, O(files of the
table). The keys left over are the caller's to delete (``DeltaTable.delete``)."""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable
from deltalake.transaction import RemoveAction


def removal_plan(
    dt: DeltaTable, doomed: Collection[tuple[int, str]], column: str
) -> tuple[list[str], set[tuple[int, str]]]:
    """How to remove the rows keyed (``checkpoint_id``, *column*) *doomed* from *dt*,
    decided from the Delta log's file statistics alone: the data files every row of
    which is doomed (:func:`remove_files` removes them), and the doomed keys that may be
    in other files (a ``DeltaTable.delete`` removes those rows). A file's keys are
    known from its statistics when it holds one row, or two rows of one checkpoint with
    different *column* values (the statistics are then the two keys), each value a
    full ``str`` of at most 32 characters (longer ones may be truncated); a file whose
    keys are not known may hold every doomed key of its ``checkpoint_id`` range."""
    actions = pa.table(dt.get_add_actions(flatten=True))
    names = ["path", "num_records", "min.checkpoint_id", "max.checkpoint_id"]
    rows = zip(
        *(actions[n].to_pylist() for n in names),
        actions[f"min.{column}"].to_pylist()
        if f"min.{column}" in actions.column_names
        else [None] * actions.num_rows,
        actions[f"max.{column}"].to_pylist()
        if f"max.{column}" in actions.column_names
        else [None] * actions.num_rows,
        strict=True,
    )
    wanted = set(doomed)
    whole: list[str] = []
    elsewhere: set[tuple[int, str]] = set()
    for path, n, lo, hi, low, high in rows:
        keys = _known_keys(n, lo, hi, low, high)
        if keys is None:
            elsewhere |= {
                k for k in wanted if (lo is None or lo <= k[0]) and (hi is None or k[0] <= hi)
            }
        elif keys <= wanted:
            whole.append(path)
        else:
            elsewhere |= keys & wanted
    return whole, elsewhere


def remove_files(
    dt: DeltaTable,
    paths: Collection[str],
    *,
    commit_properties: CommitProperties | None = None,
) -> bool:
    """Remove the data files *paths* of *dt* from the table in one commit on *dt*'s
    version (their rows vanish; the files stay on disk for time travel until a
    ``VACUUM``): what a copy-on-write delete of every row of those files commits,
    without reading or planning anything. False, committing nothing, when one of them
    is not a data file of *dt*. *dt* is not brought up to date."""
    actions = pa.table(dt.get_add_actions(flatten=True)).select(["path", "size_bytes"])
    sizes = dict(zip(actions["path"].to_pylist(), actions["size_bytes"].to_pylist(), strict=True))
    if not paths or any(p not in sizes for p in paths):
        return False
    now_ms = int(time.time() * 1000)  # what VACUUM's retention counts from: wall time
    dt.create_write_transaction(
        [RemoveAction(p, True, now_ms, sizes[p]) for p in sorted(paths)],
        "append",
        dt.schema(),
        commit_properties=commit_properties,
    )
    return True


def _known_keys(
    n: int | None, lo: int | None, hi: int | None, low: Any, high: Any
) -> set[tuple[int, str]] | None:
    """The (checkpoint id, value) keys of a data file from its statistics (see
    :func:`removal_plan`), or None when they do not tell."""
    if lo is None or lo != hi or not isinstance(low, str) or not isinstance(high, str):
        return None
    if len(low) > 32 or len(high) > 32:
        return None
    if n == 1 and low == high:
        return {(lo, low)}
    if n == 2 and low != high:
        return {(lo, low), (lo, high)}
    return None
