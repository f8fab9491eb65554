"""Files under a pipeline root that a run's processes share: resolving the root's file
system, writing a file so that readers never see half of it, and removing a directory."""

from __future__ import annotations

import os
import uuid

import pyarrow.fs as pafs

from spark_ckpt.errors import StoreError

#: Per-run files of a pipeline root: ``_runs/<run id>/...``.
RUNS_DIR = "_runs"


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The file system of *uri* (a local path or a URI pyarrow resolves) and the path in it."""
    try:
        if "://" in uri:
            fs, path = pafs.FileSystem.from_uri(uri)
            return fs, str(path)
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    except (pafs.ArrowInvalid, OSError) as e:  # type: ignore[attr-defined]
        raise StoreError(f"cannot open {uri!r}: {e}") from e


def write_atomically(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write *data* to a temporary name beside *path*, then rename it into place: readers see
    the whole file or none."""
    directory = path.rsplit("/", 1)[0]
    tmp = f"{directory}/.tmp-{uuid.uuid4().hex}"
    try:
        fs.create_dir(directory, recursive=True)
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        fs.move(tmp, path)
    except OSError as e:
        raise StoreError(f"cannot write {path}: {e}") from e


def remove_dir(fs: pafs.FileSystem, path: str) -> None:
    """Delete the directory *path* with what it holds; a missing one is fine."""
    try:
        fs.delete_dir(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise StoreError(f"cannot remove {path}: {e}") from e
