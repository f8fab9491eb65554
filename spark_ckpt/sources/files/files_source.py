"""The channel source of ``source=files``: :class:`FilesChannelSource`, driven by the source
runner (a planner worker opens it only for its schema).

Each call for heads records the new files in the listing (:mod:`.file_listing`) and returns
each channel's rows so far. Files go to the channels round robin in listing order; a channel's
log is the rows of its files, file after file, and a position is the number of rows before it.
The first record fixes the schema: the ``schema`` option, or the first file's, inferred once;
a file that does not fit it fails its read, naming the file (:mod:`.files_read_plan`).
``maxFilesPerTrigger`` records at most that many new files per micro-batch; under
``Trigger.AvailableNow`` every file there at the start is recorded and read in batches of at
most that many files (:meth:`FilesChannelSource.admit`), as in Spark. Each completed
checkpoint's positions go to ``cleanSource`` (:mod:`.clean_source`).

Cost: heads is one directory scan and a row count per new file (:mod:`.file_parsing`);
heads, ``admit`` and ``plan`` are linear in the listed files.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow as pa

from spark_ckpt.errors import ConfigError, SourceError
from spark_ckpt.sources.files.clean_source import clean_covered
from spark_ckpt.sources.files.file_listing import FileListing, ListedFile
from spark_ckpt.sources.files.file_parsing import count_rows, infer_schema
from spark_ckpt.sources.files.files_options import FilesSpec
from spark_ckpt.sources.files.files_read_plan import FileRange, FilesReadPlan
from spark_ckpt.sources.files.source_directory import SourceDirectory

log = logging.getLogger(__name__)


class FilesChannelSource:
    """See the module docstring. Driver side (the source runner)."""

    def __init__(self, spec: FilesSpec, root: str) -> None:
        self.directory = SourceDirectory(spec.path)
        try:
            self.directory.check()
        except SourceError as e:
            raise ConfigError("path", spec.path, "an existing directory") from e
        self.spec = spec
        self.listing = FileListing(root)
        header = self.listing.header
        if header is not None and (header["directory"], header["channels"]) != (
            spec.path,
            spec.channels,
        ):
            raise ConfigError(
                "channels",
                spec.channels,
                f"{header['channels']} channels over {header['directory']}, as recorded in "
                f"{self.listing.path} (the listing of this pipeline)",
            )
        self._schema = self.listing.schema or spec.schema

    @property
    def channels(self) -> int:
        return self.spec.channels

    @property
    def schema(self) -> pa.Schema:
        """The listing's schema; before the first file is recorded, the ``schema`` option or
        the schema of the file that will be recorded first (nothing is recorded here)."""
        if self._schema is None:
            found = self.listing.unlisted(self.directory)
            if not found:
                raise SourceError(
                    f"no file in {self.spec.path} yet to infer the schema from: give the "
                    "'schema' option or let a file land first"
                )
            return infer_schema(self.spec, self.directory, found[0][1])
        return self._schema

    def heads(self) -> list[int]:
        """Record new files (at most ``maxFilesPerTrigger``); each channel's rows so far."""
        self._list_new(self.spec.max_files_per_trigger)
        return self._heads()

    def heads_available_now(self) -> list[int]:
        """``Trigger.AvailableNow``: record every file there now; each channel's rows."""
        self._list_new(None)
        return self._heads()

    def admit(self, positions: Sequence[int], target: Sequence[int]) -> list[int]:
        """``Trigger.AvailableNow`` with ``maxFilesPerTrigger``: the heads of the next batch
        from *positions*, at most that many files further in listing order (a file partly
        read counts), never past *target*; *target* itself without the option."""
        limit = self.spec.max_files_per_trigger
        if limit is None:
            return list(target)
        heads = list(positions)
        ends = [0] * self.spec.channels
        taken = 0
        for f in self.listing.files:
            ends[f.channel] += f.rows
            end = min(ends[f.channel], target[f.channel])
            if f.rows == 0 or end <= positions[f.channel]:
                continue
            if taken == limit:
                break
            heads[f.channel] = end
            taken += 1
        return heads

    def _heads(self) -> list[int]:
        heads = [0] * self.spec.channels
        for f in self.listing.files:
            heads[f.channel] += f.rows
        return heads

    def _list_new(self, limit: int | None) -> None:
        found = self.listing.unlisted(self.directory)
        if limit is not None:
            found = found[:limit]
        if not found:
            return
        if self.listing.header is None:
            first = found[0][1]
            schema = self.spec.schema or infer_schema(self.spec, self.directory, first)
            self.listing.start(self.spec, schema)
            self._schema = schema
        seq = len(self.listing.files)
        new = [
            ListedFile(
                seq + i,
                name,
                size,
                mtime,
                count_rows(self.spec, self.directory, name),
                (seq + i) % self.spec.channels,
            )
            for i, (mtime, name, size) in enumerate(found)
        ]
        self.listing.record(new)

    def plan(self, channel: int, start: int, end: int) -> FilesReadPlan:
        ranges = []
        at = 0
        for f in self.listing.files:
            if f.channel != channel:
                continue
            lo, hi = max(start, at), min(end, at + f.rows)
            if lo < hi:
                ranges.append(FileRange(f, lo - at, hi - lo))
            at += f.rows
        return FilesReadPlan(channel, start, end, self.spec, self.schema, tuple(ranges))

    def checkpoint_completed(self, checkpoint_id: int, positions: Sequence[int]) -> None:
        """Source runner, after checkpoint *checkpoint_id* completed with *positions*:
        ``cleanSource`` the files it covers (see :meth:`clean`). Idempotent."""
        for path in self.clean(positions):
            log.info("cleanSource: %s (covered by checkpoint %d)", path, checkpoint_id)

    def clean(self, positions: Sequence[int]) -> list[str]:
        """``cleanSource``: archive or delete every file whose rows all lie before
        *positions* (a completed checkpoint's, per channel). Returns the files cleaned;
        a file already gone is skipped, one that cannot be moved or deleted is logged and
        tried again after the next checkpoint."""
        return clean_covered(self.spec, self.directory, self.listing.files, positions)
