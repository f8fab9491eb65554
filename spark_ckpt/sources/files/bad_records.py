"""Malformed records of ``source=files`` set aside (``badRecordsPath``) instead of failing the
read: :class:`BadRecords`.

Written on the executors, by the read that meets them; the file is named by the range and
replaced whole (on any store: :func:`~spark_ckpt.locations.objects.write_whole`), so a
replay of the range rewrites the same file. Cost: one small Parquet write per range read
that holds a malformed record.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from spark_ckpt.locations.objects import write_whole
from spark_ckpt.locations.uris import filesystem


@dataclass(frozen=True)
class BadRecords:
    """Where malformed records are set aside (``badRecordsPath``): one Parquet file per file
    range read (columns ``path``, ``line``, ``record``, ``reason``), named by the range, so a
    replay rewrites the same file."""

    directory: str

    def write(self, source: str, first: int, rows: list[dict[str, Any]]) -> None:
        fs, base = filesystem(self.directory)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", source)
        table = pa.Table.from_pylist(
            rows,
            schema=pa.schema(
                [
                    ("path", pa.string()),
                    ("line", pa.int64()),
                    ("record", pa.string()),
                    ("reason", pa.string()),
                ]
            ),
        )
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        write_whole(fs, f"{base}/{name}-{first}.parquet", sink.getvalue().to_pybytes())
