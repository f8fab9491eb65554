"""The directory ``source=files`` reads, on a local disk or an object store:
:class:`SourceDirectory`.

Built in the process that uses it (the source runner lists and counts, the executors read,
the source runner cleans) from the spec's path, through
:func:`~spark_ckpt.locations.uris.filesystem`; every failure of the store is one
:class:`~spark_ckpt.errors.StoreError` naming the file. A file's identity is its name, size
and modification time (an object's ``Last-Modified`` on a store). Cost on an object store:
a scan is one listing request per thousand entries, a stat one HEAD, a read one GET.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs

from spark_ckpt.errors import SourceError, StoreError
from spark_ckpt.locations.uris import filesystem, is_remote, join, store_errors


def _is_hidden(name: str) -> bool:
    return name.startswith((".", "_"))


class SourceDirectory:
    """The files directly in *path* (a local path or an object-store URI), hidden ones
    (``.`` or ``_`` first) left out."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fs, self._base = filesystem(path)

    def full(self, name: str) -> str:
        """The location of the file *name* (for messages and pyarrow's readers)."""
        return join(self.path, name)

    def check(self) -> None:
        """Raise a :class:`SourceError` unless the directory can hold files: a local
        directory must exist; on an object store the prefix may still be empty (files land
        later), but the bucket must answer."""
        with store_errors(self.path, "list"):
            info = self._fs.get_file_info(self._base)
            if is_remote(self.path):
                self._fs.get_file_info(pafs.FileSelector(self._base, allow_not_found=True))
                return
        if info.type is not pafs.FileType.Directory:
            raise SourceError(f"the files source's path {self.path} is not an existing directory")

    def scan(self) -> list[tuple[int, str, int]]:
        """(modification time in ns, name, size) of every file, in that order."""
        with store_errors(self.path, "list"):
            infos = self._fs.get_file_info(pafs.FileSelector(self._base, allow_not_found=True))
        return sorted(
            (info.mtime_ns or 0, info.base_name, info.size or 0)
            for info in infos
            if info.type is pafs.FileType.File and not _is_hidden(info.base_name)
        )

    def stat(self, name: str) -> tuple[int, int] | None:
        """(size, modification time in ns) of the file *name*; None if it is gone."""
        with store_errors(self.full(name), "read"):
            info = self._fs.get_file_info(f"{self._base}/{name}")
        if info.type is not pafs.FileType.File:
            return None
        return info.size or 0, info.mtime_ns or 0

    def read(self, name: str) -> bytes:
        """The whole file *name*."""
        with (
            store_errors(self.full(name), "read"),
            self._fs.open_input_stream(f"{self._base}/{name}") as f,
        ):
            return bytes(f.read())

    def input_file(self, name: str) -> pa.NativeFile:
        """The file *name* opened for random access (a Parquet footer: ranged reads)."""
        with store_errors(self.full(name), "read"):
            return self._fs.open_input_file(f"{self._base}/{name}")

    def buffer(self, name: str) -> pa.BufferReader:
        """The file *name* as a seekable in-memory reader (Parquet)."""
        return pa.BufferReader(self.read(name))

    def remove(self, name: str) -> None:
        """Delete the file *name*. Raises :class:`StoreError`."""
        with store_errors(self.full(name), "delete"):
            self._fs.delete_file(f"{self._base}/{name}")

    def move_to(self, name: str, archive: str) -> None:
        """Move the file *name* into the directory *archive* (same store; a copy and a
        delete on an object store). Raises :class:`StoreError`."""
        fs, base = filesystem(archive)
        if type(fs) is not type(self._fs):
            raise StoreError(
                f"cannot archive {self.full(name)} into {archive}: another kind of store"
            )
        with store_errors(self.full(name), f"move into {archive}"):
            fs.create_dir(base, recursive=True)
            self._fs.move(f"{self._base}/{name}", f"{base}/{name}")
