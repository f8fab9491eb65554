"""Reading one JSON commit of a Delta log (``_delta_log/<version>.json``) through a pyarrow
file system: the one place that parses commit files by hand, for the readers that need a
commit's actions in file order (the Delta tail source, the sink's roll back). Snapshots are
delta-rs' business; this reads what a single commit wrote, nothing more."""

from __future__ import annotations

import json
from typing import Any

import pyarrow.fs as pafs

#: A commit file's path relative to the table root.
COMMIT_FILE = "_delta_log/{version:020d}.json"


class DamagedCommitError(ValueError):
    """A commit file that exists but is not JSON lines (the callers translate it)."""


def read_commit(
    fs: pafs.FileSystem, version: int, *, root: str = ""
) -> list[dict[str, Any]] | None:
    """The actions of commit *version* of the table at *root* on *fs* (``""``: *fs* is rooted
    at the table), in file order; ``None`` when the file does not exist (log cleanup removed
    it, or the version was never written). A file that is not UTF-8 JSON lines raises
    :class:`DamagedCommitError`; other I/O errors propagate as the file system raised them.
    One read of one file: O(size of the commit)."""
    name = COMMIT_FILE.format(version=version)
    try:
        with fs.open_input_stream(f"{root}/{name}" if root else name) as src:
            data = src.read()
    except FileNotFoundError:
        return None
    try:
        return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
    except (UnicodeDecodeError, ValueError) as e:
        raise DamagedCommitError(f"{name}: {e}") from e
