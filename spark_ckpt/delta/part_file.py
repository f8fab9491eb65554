"""A Delta sink's in-progress part file: one Parquet file being written under the table
root, like the part files of Flink's file sink, and the names such files get.

Names are ``part-<subtask>-<uuid4>-ckpt-<sink tag>.c000.zstd.parquet``: unique and never
reused; the tag (:attr:`DeltaSinkTarget.tag <spark_ckpt.delta.sink_target.DeltaSinkTarget>`)
is a hash of the sink's app id, so a sink only ever cleans up its own files.
"""

from __future__ import annotations

import uuid
from contextlib import suppress

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from spark_ckpt.delta.boundary import delta_boundary
from spark_ckpt.delta.staged_file import StagedFile
from spark_ckpt.delta.stats import DeltaStats
from spark_ckpt.errors import StoreError

#: Parquet compression of staged files (part of the file name).
COMPRESSION = "zstd"


def part_file_name(subtask: int, tag: str) -> str:
    """A new, unique name (relative to the table root) of a part file of *subtask* of the
    sink tagged *tag*."""
    return f"part-{subtask:05d}-{uuid.uuid4()}-ckpt-{tag}.c000.{COMPRESSION}.parquet"


def is_part_file_name(path: str, tag: str) -> bool:
    """Whether *path* (relative to the table root) names a part file of the sink tagged
    *tag*."""
    return path.startswith("part-") and f"-ckpt-{tag}." in path and path.endswith(".parquet")


class PartFile:
    """An in-progress staged file: a Parquet writer open under the table root. Each
    :meth:`write` adds one row group and updates the Delta statistics; :meth:`close` writes
    the footer and describes the file. Until then the file has no footer: a crash leaves a
    truncated file that nothing references, which the orphan sweep of
    :meth:`DeltaSinkCommitter.recover
    <spark_ckpt.delta.sink_committer.DeltaSinkCommitter.recover>` deletes. Not thread safe
    (one writer thread per subtask). Errors of Arrow and the file system raise
    :class:`StoreError`."""

    def __init__(self, fs: pafs.FileSystem, name: str, schema: pa.Schema) -> None:
        self.fs = fs
        self.name = name
        self.schema = schema
        self.stats = DeltaStats()
        self.nbytes = 0
        self._stream = fs.open_output_stream(name)
        self._writer = pq.ParquetWriter(
            self._stream,
            schema,
            compression=COMPRESSION,
            coerce_timestamps="us",
            use_deprecated_int96_timestamps=False,
        )

    def write(self, table: pa.Table) -> None:
        with delta_boundary(f"staging {self.name}", StoreError):
            self._writer.write_table(table)
        self.stats.add(table)
        self.nbytes += table.nbytes

    def close(self) -> StagedFile:
        with delta_boundary(f"staging {self.name}", StoreError):
            self._writer.close()
            self._stream.close()
            info = self.fs.get_file_info(self.name)
        mtime = 0 if info.mtime_ns is None else info.mtime_ns // 1_000_000
        return StagedFile(
            self.name, int(info.size or 0), self.stats.rows, self.stats.to_json(), mtime
        )

    def discard(self) -> None:
        """Close without describing and delete the file (best effort: the orphan sweep
        deletes whatever is left)."""
        with delta_boundary(f"discarding {self.name}", StoreError):
            try:
                self._writer.close()
                self._stream.close()
            finally:
                with suppress(FileNotFoundError):
                    self.fs.delete_file(self.name)
