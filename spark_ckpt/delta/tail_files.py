"""Where the Delta tail source finds the tailed table's files, on the driver (commit files,
Parquet footers) and on the executors (data files): a native pyarrow file system resolved
from the table URI (local paths, ``file://``, and the object stores pyarrow supports, with
credentials from the environment). *storage_options* go to delta-rs only; delta-rs' own
Python file system handler is avoided (with deltalake 1.6 and pyarrow 26 using it aborts the
interpreter at exit). Errors of delta-rs, Arrow and the OS become
:class:`~spark_ckpt.errors.ProtocolError` (:func:`tail_boundary`)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from urllib.parse import unquote

import pyarrow.fs as pafs

from spark_ckpt.delta.boundary import delta_boundary
from spark_ckpt.errors import ProtocolError
from spark_ckpt.locations.uris import filesystem


def table_filesystem(root: str) -> tuple[pafs.FileSystem, str]:
    """The native pyarrow file system of *root* and the root's path in it."""
    with tail_boundary(f"resolving the file system of {root}"):
        fs, path = filesystem(root)
    return fs, path.rstrip("/")


def file_location(fs: pafs.FileSystem, base: str, path: str) -> tuple[pafs.FileSystem, str]:
    """Where the data file with Delta-log *path* lives: relative paths are URL-decoded and
    joined to the table root *base* on *fs*; absolute URIs get their own file system."""
    if "://" in path:
        return table_filesystem(path)
    return fs, f"{base}/{unquote(path)}"


def tail_boundary(what: str) -> AbstractContextManager[None]:
    """Translate delta-rs / Arrow / OS errors into :class:`ProtocolError`."""
    return delta_boundary(what, ProtocolError)
