"""Files under a pipeline root that a run's processes share: the runs' folder and removing a
directory (resolving the root and writing whole files: :mod:`spark_ckpt.locations`)."""

from __future__ import annotations

import pyarrow.fs as pafs

from spark_ckpt.errors import StoreError

#: Per-run files of a pipeline root: ``_runs/<run id>/...``.
RUNS_DIR = "_runs"


def remove_dir(fs: pafs.FileSystem, path: str) -> None:
    """Delete the directory *path* with what it holds; a missing one is fine."""
    try:
        fs.delete_dir(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise StoreError(f"cannot remove {path}: {e}") from e
