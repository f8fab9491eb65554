"""The durable listing of ``source=files``: which files of the directory the pipeline has
recorded, in what order, with what size, modification time, row count and channel.

A log of lines under the pipeline root: a header line (directory, format, channels,
schema), then a line per file. The recorded order is the log: a replay, a restart or a
restore reads the same files in the same order, whatever the directory holds by then. New
files are taken in order of modification time, then name; hidden files (``.`` or ``_``
first) are never taken.

Where the lines live (:func:`listing_log`):

* a local root: one append-only file (:data:`LISTING`), each batch of lines synced before it
  counts; a torn last line (the source runner was killed while appending) is ignored and
  overwritten;
* an object store (no append, no rename): a segment object per batch of lines under
  :data:`SEGMENTS`, named by the index of its first line and written whole (one PUT, visible
  complete or not at all); every :data:`COMPACT_EVERY` segments a ``base-<n>`` object holds
  lines ``[0, n)`` and the segments it covers are deleted, so opening the listing is one
  listing request and at most :data:`COMPACT_EVERY` + 1 reads, however long its history.

A savepoint carries the listing as it was when the savepoint was exported (one object in the
local format, :func:`export_listing`), and a restore seeds the new root with it
(:func:`seed_listing`): the positions it restores mean the same files.

Written by the source runner only; read wherever the source is opened (the source runner, a
planner worker asking for the schema). Opening reads the whole listing once; an append
writes only the new lines; a scan for new files is one directory listing and a row count
per unrecorded file.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import pyarrow as pa
import pyarrow.fs as pafs

from spark_ckpt.errors import RestoreError, SourceError, StoreError
from spark_ckpt.locations.objects import write_whole
from spark_ckpt.locations.uris import filesystem, is_remote, join, store_errors
from spark_ckpt.sources.files.files_options import FilesSpec
from spark_ckpt.sources.files.source_directory import SourceDirectory

LISTING: Final = os.path.join("_sources", "files.jsonl")
#: Where an object-store root keeps the listing's segments.
SEGMENTS: Final = "_sources/files"
#: Segments after which an object-store listing is compacted into one base object.
COMPACT_EVERY: Final = 32
LISTING_VERSION: Final = 1
log = logging.getLogger(__name__)
_SEGMENT = re.compile(r"^(base-)?(\d{12})\.jsonl$")


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


class ListingLog(Protocol):
    """Where a listing's lines are kept (see the module docstring)."""

    where: str

    def read(self) -> list[bytes]:
        """Every complete line, in order (without their newlines)."""
        ...

    def append(self, lines: Sequence[bytes]) -> None:
        """Add *lines* after the last one read or appended; durable on return."""
        ...


class AppendedFile:
    """A local root's listing: one append-only file, synced at every append."""

    def __init__(self, root: str) -> None:
        self.where = os.path.join(root, LISTING)
        self._good_bytes = 0

    def read(self) -> list[bytes]:
        if not os.path.exists(self.where):
            return []
        with open(self.where, "rb") as f:
            data = f.read()
        lines, good = [], 0
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break  # torn
            lines.append(line[:-1])
            good += len(line)
        self._good_bytes = good
        return lines

    def append(self, lines: Sequence[bytes]) -> None:
        os.makedirs(os.path.dirname(self.where), exist_ok=True)
        payload = b"".join(line + b"\n" for line in lines)
        with open(self.where, "ab") as f:
            f.truncate(self._good_bytes)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        self._good_bytes += len(payload)


class SegmentObjects:
    """An object-store root's listing: whole segment objects, compacted every
    :data:`COMPACT_EVERY` (see the module docstring)."""

    def __init__(self, root: str) -> None:
        self.where = join(root, SEGMENTS)
        self._fs, self._base = filesystem(self.where)
        self._lines_so_far: list[bytes] = []  # read or appended
        self._segments: list[str] = []  # names of the segments after the newest base

    def read(self) -> list[bytes]:
        with store_errors(self.where, "list"):
            infos = self._fs.get_file_info(pafs.FileSelector(self._base, allow_not_found=True))
        bases: list[tuple[int, str]] = []
        segments: list[tuple[int, str]] = []
        for info in infos:
            found = _SEGMENT.match(info.base_name)
            if found:
                kind = bases if found.group(1) else segments
                kind.append((int(found.group(2)), info.base_name))
        start, lines = 0, []
        if bases:
            start, name = max(bases)
            lines = self._lines(name)
            if len(lines) != start:
                raise SourceError(
                    f"the file listing {self.where}/{name} is damaged: "
                    f"{len(lines)} lines, its name says {start}"
                )
        self._segments = []
        for first, name in sorted(segments):
            if first < start:
                continue  # covered by the base (its deletion was cut short)
            if first != len(lines):
                raise SourceError(
                    f"the file listing {self.where} is damaged: segment {name} follows line "
                    f"{len(lines)}"
                )
            lines.extend(self._lines(name))
            self._segments.append(name)
        self._lines_so_far = lines
        return list(lines)

    def _lines(self, name: str) -> list[bytes]:
        with (
            store_errors(f"{self.where}/{name}", "read"),
            self._fs.open_input_stream(f"{self._base}/{name}") as f,
        ):
            data = bytes(f.read())
        if data and not data.endswith(b"\n"):
            raise SourceError(f"the file listing {self.where}/{name} is damaged: a torn line")
        return data.splitlines()

    def append(self, lines: Sequence[bytes]) -> None:
        name = f"{len(self._lines_so_far):012d}.jsonl"
        write_whole(self._fs, f"{self._base}/{name}", b"".join(line + b"\n" for line in lines))
        self._lines_so_far.extend(lines)
        self._segments.append(name)
        if len(self._segments) >= COMPACT_EVERY:
            try:
                self._compact()
            except StoreError as e:  # the lines are durable: compacting waits for next time
                log.warning("cannot compact the file listing %s: %s", self.where, e)

    def _compact(self) -> None:
        """Write lines ``[0, n)`` as ``base-<n>``, then delete what it covers. A crash in
        between leaves covered objects that readers skip and the next compaction deletes."""
        count = len(self._lines_so_far)
        name = f"base-{count:012d}.jsonl"
        data = b"".join(line + b"\n" for line in self._lines_so_far)
        write_whole(self._fs, f"{self._base}/{name}", data)
        with store_errors(self.where, "compact"):
            infos = self._fs.get_file_info(pafs.FileSelector(self._base, allow_not_found=True))
            for info in infos:
                found = _SEGMENT.match(info.base_name)
                if found is None or info.base_name == name:
                    continue
                at = int(found.group(2))  # a base's end, a segment's first line
                if (found.group(1) and at <= count) or (not found.group(1) and at < count):
                    self._fs.delete_file(f"{self._base}/{info.base_name}")
        self._segments = []


def listing_log(root: str) -> ListingLog:
    """The listing's lines under the pipeline root *root* (see the module docstring)."""
    return SegmentObjects(root) if is_remote(root) else AppendedFile(root)


class FileListing:
    """The record of the files of one pipeline's directory (see the module docstring): a
    header line (directory, format, channels, schema), then a line per file."""

    def __init__(self, root: str) -> None:
        self._log = listing_log(root)
        self.path = self._log.where
        self.header: dict[str, Any] | None = None
        self.files: list[ListedFile] = []
        self._load(self._log.read(), self.path)

    def _load(self, lines: Sequence[bytes], where: str) -> None:
        for line in lines:
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise SourceError(f"the file listing {where} is damaged: {e}") from e
            if self.header is None:
                self.header = d
            else:
                self.files.append(ListedFile(**d))

    def lines(self) -> list[bytes]:
        """The listing as lines: the header, then each file."""
        if self.header is None:
            return []
        return [
            json.dumps(self.header, sort_keys=True).encode(),
            *(f.to_json().encode() for f in self.files),
        ]

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
        self._log.append([json.dumps(header, sort_keys=True).encode()])
        self.header = header

    def record(self, files: Sequence[ListedFile]) -> None:
        if files:
            self._log.append([f.to_json().encode() for f in files])
        self.files.extend(files)

    def unlisted(self, directory: SourceDirectory) -> list[tuple[int, str, int]]:
        """(modification time, name, size) of the files in *directory* not recorded yet,
        hidden ones left out, in listing order."""
        known = {f.path for f in self.files}
        return [found for found in directory.scan() if found[1] not in known]

    def extend_from(self, lines: Sequence[bytes], where: str) -> bool:
        """Make this listing hold *lines* (another listing's, from *where*): append what it
        lacks when it is a prefix of them; nothing when they are a prefix of it. Returns
        whether anything was appended; raises :class:`RestoreError` when the two disagree
        (the positions of one would mean other files in the other)."""
        mine = self.lines()
        common = min(len(mine), len(lines))
        if [json.loads(x) for x in mine[:common]] != [json.loads(x) for x in lines[:common]]:
            raise RestoreError(
                f"the files source's listing at {self.path} differs from the one restored "
                f"from {where}: their positions would mean other files (restore into a new "
                "root, or from a savepoint of this pipeline)"
            )
        if len(lines) <= len(mine):
            return False
        self._log.append(list(lines[len(mine) :]))
        self._load(lines[len(mine) :], where)
        return True


#: Where a savepoint directory keeps the listing (one object, in the local format).
SAVED_LISTING: Final = "_sources/files.jsonl"


def export_listing(root: str, savepoint: str) -> bool:
    """Copy the files source's listing of the pipeline root *root*, if it has one, into the
    savepoint directory *savepoint* (written whole). Returns whether there was one."""
    lines = FileListing(root).lines()
    if not lines:
        return False
    fs, base = filesystem(savepoint)
    write_whole(fs, f"{base}/{SAVED_LISTING}", b"".join(x + b"\n" for x in lines))
    return True


def saved_listing(location: str) -> list[bytes]:
    """The listing a savepoint directory or another pipeline root *location* holds, as
    lines (empty: none)."""
    if not is_remote(location):
        return AppendedFile(location).read()  # a local savepoint's copy has the same form
    fs, base = filesystem(location)
    path = f"{base}/{SAVED_LISTING}"
    with store_errors(join(location, SAVED_LISTING), "read"):
        if fs.get_file_info(path).type is pafs.FileType.File:
            with fs.open_input_stream(path) as f:
                return bytes(f.read()).splitlines()
    return SegmentObjects(location).read()


def seed_listing(root: str, source: str) -> bool:
    """Before a restore from *source* (a savepoint directory or another root) into the
    pipeline root *root*: make *root*'s listing hold *source*'s (see
    :meth:`FileListing.extend_from`). Returns whether anything was written."""
    lines = saved_listing(source)
    if not lines:
        return False
    try:
        return FileListing(root).extend_from(lines, source)
    except StoreError as e:
        raise RestoreError(f"cannot seed the files source's listing of {root}: {e}") from e
