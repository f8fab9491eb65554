"""Removing rows of the store tables by whole data files, decided from the Delta log's
statistics. Oracle: the rows written, kept or dropped by a plain filter here."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from spark_ckpt.delta.file_removal import removal_plan, remove_files


def test_a_removal_plan_removes_only_files_whose_every_row_goes(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    files = [  # one append (one data file) each
        [(1, "a" * 32)],
        [(2, "b" * 32), (2, "c" * 32)],
        [(3, "d" * 32), (3, "e" * 32)],
        [(4, "f" * 32), (4, "g" * 32), (4, "h" * 32)],
        [(5, "i" * 32)],
        [(6, "j" * 40)],  # longer than the statistics keep whole
    ]
    for rows in files:
        ids, bids = zip(*rows, strict=True)
        write_deltalake(
            uri,
            pa.table({"checkpoint_id": pa.array(ids, pa.int64()), "blob_id": list(bids)}),
            mode="append",
        )
    doomed = {(1, "a" * 32), (2, "b" * 32), (2, "c" * 32), (3, "d" * 32), (4, "g" * 32)}
    doomed |= {(6, "j" * 40), (7, "x" * 32)}  # the last is in no file
    dt = DeltaTable(uri)
    whole, elsewhere = removal_plan(dt, doomed, "blob_id")
    assert len(whole) == 2  # the files of checkpoints 1 and 2
    assert elsewhere == {(3, "d" * 32), (4, "g" * 32), (6, "j" * 40)}
    assert remove_files(dt, whole)
    dt = DeltaTable(uri)
    dt.delete("blob_id IN ('" + "', '".join(b for _, b in sorted(elsewhere)) + "')")
    left = pl.read_delta(uri).sort("checkpoint_id", "blob_id")
    expected = sorted(r for rows in files for r in rows if r not in doomed)
    assert list(zip(left["checkpoint_id"], left["blob_id"], strict=True)) == expected
    assert not remove_files(DeltaTable(uri), whole)  # gone already: nothing committed
