"""A staged file of a Delta sink: one sealed Parquet file under the table root, described well
enough to add it to the Delta log without reading it again. A sealed
:class:`~spark_ckpt.sinks.two_phase_commit.Transaction` of a Delta sink carries its staged files as
JSON (:func:`staged_files`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from deltalake.transaction import AddAction

from spark_ckpt.errors import ProtocolError
from spark_ckpt.sinks.two_phase_commit import Transaction


@dataclass(frozen=True)
class StagedFile:
    """One staged Parquet file. ``path`` is relative to the table root (what the Delta log
    records), ``size`` in bytes, ``rows`` its row count, ``stats`` the Delta statistics JSON
    (``numRecords``/``minValues``/``maxValues``/``nullCount``), ``modification_time`` in
    milliseconds since the epoch as the file system reported it."""

    path: str
    size: int
    rows: int
    stats: str
    modification_time: int = 0

    def to_json(self) -> str:
        return json.dumps(
            {
                "path": self.path,
                "size": self.size,
                "rows": self.rows,
                "stats": self.stats,
                "modification_time": self.modification_time,
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @staticmethod
    def from_json(text: str) -> StagedFile:
        try:
            d: dict[str, Any] = json.loads(text)
            return StagedFile(
                str(d["path"]),
                int(d["size"]),
                int(d["rows"]),
                str(d["stats"]),
                int(d.get("modification_time", 0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"not a staged file: {text!r}") from e

    def add_action(self) -> AddAction:
        return AddAction(self.path, self.size, {}, self.modification_time, True, self.stats)


def staged_files(txn: Transaction) -> list[StagedFile]:
    """The files of a transaction sealed by
    :meth:`~spark_ckpt.delta.sink_writer.DeltaSinkWriter.pre_commit`."""
    return [StagedFile.from_json(p) for p in txn.payload]
