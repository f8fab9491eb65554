"""The durable listing of ``source=files``: which files of the directory the pipeline has
recorded, in what order, with what size, modification time, row count and channel.

One append-only file under the pipeline root (:data:`LISTING`): a header line (directory,
format, channels, schema), then a line per file, each batch of lines synced before it
counts. The recorded order is the log: a replay, a restart or a restore reads the same files
in the same order, whatever the directory holds by then. New files are taken in order of
modification time, then name; hidden files (``.`` or ``_`` first) are never taken. A torn
last line (the source runner was killed while appending) is ignored and overwritten.

Written by the source runner only; read wherever the source is opened (the source runner,
a planner worker asking for the schema). Opening reads the whole listing once; an append
writes and syncs only the new lines; a scan for new files is one directory listing and a
stat per unrecorded file.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa

from spark_ckpt.errors import ConfigError, SourceError
from spark_ckpt.locations.uris import is_remote
from spark_ckpt.sources.files.files_options import FilesSpec

LISTING: Final = os.path.join("_sources", "files.jsonl")
LISTING_VERSION: Final = 1


@dataclass(frozen=True)
class ListedFile:
    """A file as recorded in the listing."""

    seq: int
    path: str  # relative to the directory
    size: int
    mtime_ns: int
    rows: int
    channel: int

    def to_json(self) -> str:
        return json.dumps(
            {
                "seq": self.seq,
                "path": self.path,
                "size": self.size,
                "mtime_ns": self.mtime_ns,
                "rows": self.rows,
                "channel": self.channel,
            },
            sort_keys=True,
        )


def _is_hidden(name: str) -> bool:
    return name.startswith((".", "_"))


class FileListing:
    """The append-only record of the files of one pipeline's directory (see the module
    docstring): a header line (directory, format, channels, schema), then a line per file.
    A torn last line (the source runner was killed while appending) is ignored and
    overwritten."""

    def __init__(self, root: str) -> None:
        if is_remote(root):  # an append-only local file: a remote root cannot hold it yet
            raise ConfigError(
                "store",
                root,
                "a local pipeline root for source=files: its listing of the directory is an "
                "append-only file under the root, not on object storage yet",
            )
        self.path = os.path.join(root, LISTING)
        self.header: dict[str, Any] | None = None
        self.files: list[ListedFile] = []
        self._good_bytes = 0
        if os.path.exists(self.path):
            self._load()

    def _load(self) -> None:
        with open(self.path, "rb") as f:
            data = f.read()
        good = 0
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break  # torn
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise SourceError(f"the file listing {self.path} is damaged: {e}") from e
            if self.header is None:
                self.header = d
            else:
                self.files.append(ListedFile(**d))
            good += len(line)
        self._good_bytes = good

    @property
    def schema(self) -> pa.Schema | None:
        if self.header is None:
            return None
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(self.header["schema"])))

    def start(self, spec: FilesSpec, schema: pa.Schema) -> None:
        """Record the header (the first file's listing fixes the schema)."""
        header = {
            "v": LISTING_VERSION,
            "directory": spec.path,
            "format": spec.format,
            "channels": spec.channels,
            "schema": base64.b64encode(schema.serialize().to_pybytes()).decode(),
        }
        self._append([json.dumps(header, sort_keys=True)])
        self.header = header

    def record(self, files: Sequence[ListedFile]) -> None:
        self._append([f.to_json() for f in files])
        self.files.extend(files)

    def unlisted(self, directory: str) -> list[tuple[int, str, int]]:
        """(modification time, name, size) of the files in *directory* not recorded yet,
        hidden ones left out, in listing order."""
        known = {f.path for f in self.files}
        found = []
        for entry in os.scandir(directory):
            if entry.is_file() and not _is_hidden(entry.name) and entry.name not in known:
                st = entry.stat()
                found.append((st.st_mtime_ns, entry.name, st.st_size))
        return sorted(found)

    def _append(self, lines: Sequence[str]) -> None:
        if not lines:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "ab") as f:
            f.truncate(self._good_bytes)
            payload = "".join(line + "\n" for line in lines).encode()
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        self._good_bytes += len(payload)
