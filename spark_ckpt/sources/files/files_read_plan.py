"""Reading ``source=files`` on the executors: :class:`FilesReadPlan`, rows ``[start, end)``
of one channel as ranges of its listed files.

The plan is made in the source runner (:meth:`.files_source.FilesChannelSource.plan`) and
pickled into Spark's input partition. Its read is deterministic: the same rows, in the same
order, at the same positions, on any executor, or a :class:`~spark_ckpt.errors.SourceError`
naming the file:

- a file whose size or modification time differs from its record changed after it was
  listed (a replay could not return the same rows);
- a malformed JSON line or CSV row is named (file and line); with ``badRecordsPath`` it is set
  aside (:mod:`.bad_records`) and its position is left empty (a gap, as in Kafka's offsets);
- a Parquet file whose columns do not fit the source's schema is named.

Cost: each range's file is read once, in full (a Parquet file is sliced after the read); a
range with a malformed record is parsed again line by line to find it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from spark_ckpt.errors import SourceError
from spark_ckpt.sources.files.bad_records import BadRecords
from spark_ckpt.sources.files.file_listing import ListedFile
from spark_ckpt.sources.files.file_parsing import conform, parse_lines, text_lines
from spark_ckpt.sources.files.files_options import FilesSpec
from spark_ckpt.sources.files.source_directory import SourceDirectory


@dataclass(frozen=True)
class FileRange:
    """Rows ``[first, first + rows)`` of one listed file."""

    file: ListedFile
    first: int
    rows: int


@dataclass(frozen=True)
class FilesReadPlan:
    """Rows ``[start, end)`` of one channel: *ranges* of its files, in order (picklable; read
    on an executor)."""

    channel: int
    start: int
    end: int
    spec: FilesSpec
    schema: pa.Schema
    ranges: tuple[FileRange, ...] = field(default=())

    def read(self) -> pa.Table:
        return self.read_positioned()[0]

    def read_positioned(self) -> tuple[pa.Table, pa.Array]:
        """The rows and each row's position (a malformed record set aside leaves a gap)."""
        tables, positions = [], []
        at = self.start
        directory = SourceDirectory(self.spec.path) if self.ranges else None
        for r in self.ranges:
            assert directory is not None
            table, kept = self._read_range(directory, r)
            tables.append(table)
            positions.append(pa.array(at + kept, pa.int64()))
            at += r.rows
        if not tables:
            return self.schema.empty_table(), pa.array([], pa.int64())
        return pa.concat_tables(tables), pa.concat_arrays(positions)

    def _read_range(
        self, directory: SourceDirectory, r: FileRange
    ) -> tuple[pa.Table, npt.NDArray[np.int64]]:
        full = directory.full(r.file.path)
        found = directory.stat(r.file.path)
        if found is None:
            raise SourceError(f"file {full} (listed) cannot be read: it is gone")
        if found != (r.file.size, r.file.mtime_ns):
            raise SourceError(
                f"file {full} changed after it was listed (size {r.file.size} -> {found[0]}, "
                "or its modification time): files must not change once they landed"
            )
        data = directory.read(r.file.path)
        if self.spec.format == "parquet":
            table = pq.read_table(pa.BufferReader(data)).slice(r.first, r.rows)
            return conform(table, self.schema, full), np.arange(r.rows, dtype=np.int64)
        lines = text_lines(data)
        header: bytes | None = None
        if self.spec.format == "csv" and self.spec.header:
            header, lines = lines[0][1], lines[1:]
        wanted = lines[r.first : r.first + r.rows]
        try:
            parsed = self._parse([line for _, line in wanted], header)
            return parsed, np.arange(len(wanted), dtype=np.int64)
        except (pa.ArrowInvalid, ValueError):
            pass  # find the bad lines, one by one
        good: list[bytes] = []
        kept: list[int] = []
        bad: list[dict[str, Any]] = []
        for i, (number, line) in enumerate(wanted):
            try:
                self._parse([line], header)
            except (pa.ArrowInvalid, ValueError) as e:
                reason = str(e).splitlines()[0]
                if self.spec.bad_records_path is None:
                    raise SourceError(
                        f"malformed {self.spec.format} record in {full}, line {number}: {reason}"
                    ) from e
                bad.append(
                    {
                        "path": full,
                        "line": number,
                        "record": line.decode(errors="replace"),
                        "reason": reason,
                    }
                )
                continue
            good.append(line)
            kept.append(i)
        if bad and self.spec.bad_records_path is not None:
            BadRecords(self.spec.bad_records_path).write(r.file.path, r.first, bad)
        return self._parse(good, header), np.asarray(kept, dtype=np.int64)

    def _parse(self, lines: list[bytes], header: bytes | None) -> pa.Table:
        return parse_lines(self.spec.format, self.schema, lines, header)
