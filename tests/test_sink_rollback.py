"""Rolling a two-phase-commit sink back to a restored checkpoint: afterwards the table holds
exactly the output of checkpoints <= it (a restore that fell back past a damaged newest
checkpoint replays the rest). Checked against a plain model with a log replay of our own
and with polars as a second reader."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st
from test_delta_sink import OP, batch, content, log_actions, make_sink, replay, rows

from spark_ckpt.sink import MemorySink


def commit(sink: object, checkpoint_id: int, first: int, n: int) -> list:  # type: ignore[type-arg]
    sink.write(OP, 0, batch(rows(first, n)))  # type: ignore[attr-defined]
    txn = sink.pre_commit(OP, 0, checkpoint_id)  # type: ignore[attr-defined]
    assert sink.commit_checkpoint(checkpoint_id, [txn])  # type: ignore[attr-defined]
    return rows(first, n)


def test_roll_back_withdraws_later_output_only(tmp_path: Path) -> None:
    root = tmp_path / "t"
    sink = make_sink(root)
    out = {c: commit(sink, c, 100 * c, 3) for c in (1, 2, 3, 4)}
    other = pa.table(
        {
            "id": [999],
            "name": ["other"],
            "ts": batch(rows(0, 1)).column("ts").cast(pa.timestamp("us", "UTC")),
        }
    )
    write_deltalake(str(root), other, mode="append")  # another writer, after checkpoint 4
    withdrawn = sink.roll_back_to(2)
    assert len(withdrawn) == 2
    expected = [*out[1], *out[2], (999, "other", rows(0, 1)[0][2])]
    assert content(replay(root)) == sorted(expected)
    assert sorted(pl.read_delta(str(root)).get_column("id").to_list()) == sorted(
        r[0] for r in expected
    )
    assert sink.committed_checkpoint() == 2
    assert sink.roll_back_to(2) == [] and sink.roll_back_to(3) == []  # idempotent
    out[5] = commit(sink, 5, 500, 2)  # later checkpoints commit normally
    assert content(replay(root)) == sorted(expected + out[5])
    protocol = [a["protocol"] for _, acts in log_actions(root) for a in acts if "protocol" in a]
    assert all((p["minReaderVersion"], p["minWriterVersion"]) == (1, 2) for p in protocol)
    assert DeltaTable(str(root)).protocol().min_writer_version == 2


def test_roll_back_without_table_or_later_output_is_a_no_op(tmp_path: Path) -> None:
    sink = make_sink(tmp_path / "t")
    assert sink.roll_back_to(3) == []
    commit(sink, 3, 0, 2)
    assert sink.roll_back_to(3) == [] and sink.roll_back_to(7) == []
    assert sink.committed_checkpoint() == 3


@settings(max_examples=15, deadline=None)
@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=5),
    st.data(),
)
def test_roll_back_matches_a_plain_model(
    tmp_path_factory: object, sizes: list[int], data: st.DataObject
) -> None:
    root = tmp_path_factory.mktemp("t")  # type: ignore[attr-defined]
    sinks = (make_sink(root), MemorySink())
    model: list[tuple[int, list]] = []  # type: ignore[type-arg]
    for c, n in enumerate(sizes, start=1):
        model.append((c, commit(sinks[0], c, 10 * c, n)))
        commit(sinks[1], c, 10 * c, n)
    back = data.draw(st.integers(0, len(sizes)))
    for sink in sinks:
        sink.roll_back_to(back)
        assert sink.committed_checkpoint() == (back if back < len(sizes) else len(sizes))
    expected = sorted(r for c, rs in model if c <= back for r in rs)
    assert content(replay(root)) == expected
    memory = sinks[1].output()
    ids = [] if memory is None else sorted(memory.column("id").to_pylist())
    assert ids == [r[0] for r in expected]
