"""Where a Delta sink writes: the table, the file system rooted at it, and the sink's
identity in it — shared by the sink's writer and committer, which may be built in different
processes from the same arguments."""

from __future__ import annotations

import hashlib
import os

import pyarrow.fs as pafs

from spark_ckpt.delta.boundary import delta_boundary
from spark_ckpt.delta.part_file import is_part_file_name
from spark_ckpt.errors import StoreError
from spark_ckpt.locations import uris
from spark_ckpt.locations.credentials import StorageOptions, for_delta


class DeltaSinkTarget:
    """The Delta table at *table_uri* (a local path or a URI delta-rs understands;
    *storage_options* are passed to delta-rs) as pipeline *pipeline* writes it. Staging and
    reading go through :attr:`fs`, a pyarrow file system whose root is the table root
    (default: a ``SubTreeFileSystem`` over the location's file system, see
    :mod:`spark_ckpt.locations`; pass *filesystem* for object stores whose credentials pyarrow
    does not find by itself).
    The identity of the sink's transactions belongs to the pipeline and the table, never to
    the operator chain that produced the output: :attr:`app_id` (``spark-ckpt/<pipeline>``)
    is the Delta app transaction id of the sink's commits, whichever version of the job
    makes them, and :attr:`sink_id` (the table URI) is recorded in every transaction it
    seals. :attr:`legacy_app_id_prefix` (``spark-ckpt/<pipeline>/``) matches the app ids
    that versions before 0.2 used (``spark-ckpt/<pipeline>/<first operator uid>``), which a
    roll back withdraws too. :attr:`tag`, a hash of the app id, is part of every file name
    the sink stages. The table is not partitioned. Immutable; cheap to build (it does not
    load the table)."""

    def __init__(
        self,
        table_uri: str,
        *,
        pipeline: str,
        storage_options: dict[str, str] | None = None,
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        if "://" not in table_uri:
            table_uri = os.path.abspath(table_uri)
        self.table_uri = table_uri.rstrip("/")
        self.pipeline = pipeline
        StorageOptions.of(storage_options, [self.table_uri]).install()  # its staged files too
        self.storage_options = for_delta(self.table_uri, storage_options)
        self.app_id = f"spark-ckpt/{pipeline}"
        self.legacy_app_id_prefix = f"{self.app_id}/"
        #: The identity of the sink's storage, recorded in its transactions.
        self.sink_id = self.table_uri
        #: Part of every staged file name of this sink (hex, 12 chars).
        self.tag = hashlib.sha256(self.app_id.encode()).hexdigest()[:12]
        if filesystem is None:
            base, root = uris.filesystem(self.table_uri)
            #: The file system the table root lives on, and the root's path in it ("" when
            #: *filesystem* was given: it is rooted at the table already).
            self.base_fs: pafs.FileSystem = base
            self.root: str = root
            filesystem = pafs.SubTreeFileSystem(root, base)
        else:
            self.base_fs, self.root = filesystem, ""
        self.fs: pafs.FileSystem = filesystem

    def is_staged_name(self, path: str) -> bool:
        """Whether *path* (relative to the table root) is a file this sink stages."""
        return is_part_file_name(path, self.tag)

    def is_own_app_id(self, app_id: str) -> bool:
        """Whether Delta app transaction *app_id* is this sink's: its own, or one a version
        before 0.2 used for the same pipeline."""
        return app_id == self.app_id or app_id.startswith(self.legacy_app_id_prefix)

    def staged_paths(self, *, before_ms: int | None = None) -> list[str]:
        """Every file of this sink under the table root, committed or not (sorted); with
        *before_ms*, only those last modified before that time (ms since the epoch)."""
        with delta_boundary(f"listing {self.table_uri}", StoreError):
            infos = self.fs.get_file_info(pafs.FileSelector("", allow_not_found=True))
        return sorted(
            i.base_name
            for i in infos
            if self.is_staged_name(i.base_name)
            and (before_ms is None or i.mtime_ns is None or i.mtime_ns // 1_000_000 < before_ms)
        )
