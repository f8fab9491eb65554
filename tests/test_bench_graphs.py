"""The graphs bench's arithmetic and options (``bench/runbench/graphbench.py``,
``bench/runbench/graph_variants.py``) on hand-made query progress and options, without Spark:
the oracle is the arithmetic of the listed batches, options and rows/s."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from runbench.graph_variants import GraphStarted, stages_job
from runbench.graphbench import (
    CHECK_ROWS_PER_CHANNEL,
    FULL,
    QUICK,
    RATIOS,
    STAGE_LINES,
    check_source,
    compare_windows,
    file_sink_files,
    generated_rows,
    join_sources,
    lines,
    output_rows,
    per_row,
    ratios_of,
    selected,
)
from runbench.steady import batch_rows
from runbench.two_stages import COUNTRIES, WINDOW_MS, UserCounts, count_users, window_sums

from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.spark.datasource.source_options import INPUTS, INPUTS_KIND, SourceOptions


def offset(*positions: int) -> str:
    return json.dumps({"v": 1, "positions": list(positions), "emitted": [0], "barriers": []})


def test_batch_rows_sum_every_ckpt_source_of_a_join() -> None:
    """Spark's join reads one ckpt-source per input: the batch read both inputs' rows."""
    p = {
        "batchId": 4,
        "numInputRows": 7,
        "sources": [
            {"startOffset": offset(100, 100), "endOffset": offset(175, 175)},
            {"startOffset": None, "endOffset": offset(50, 25)},
        ],
    }
    assert batch_rows(p) == 150 + 75
    # one source of the union form (spark-ckpt's join): its four channels
    union = {
        "batchId": 4,
        "sources": [{"startOffset": offset(1, 1, 1, 1), "endOffset": offset(2, 3, 4, 5)}],
    }
    assert batch_rows(union) == 1 + 2 + 3 + 4
    assert batch_rows({"batchId": 1, "numInputRows": 9, "sources": [{"endOffset": None}]}) == 9


def test_join_inputs_split_the_micro_batch_and_differ_by_seed_only() -> None:
    inputs = join_sources(FULL)
    assert list(inputs) == ["clicks", "impressions"]
    clicks, impressions = inputs["clicks"], inputs["impressions"]
    assert isinstance(clicks, dict) and isinstance(impressions, dict)
    assert clicks["maxRowsPerTrigger"] == impressions["maxRowsPerTrigger"] == FULL.batch_rows // 2
    assert (clicks["seed"], impressions["seed"]) == (7, 8)
    assert {**clicks, "seed": 0} == {**impressions, "seed": 0}
    assert clicks["keys"] == 100_000 and clicks["channels"] == 2
    # the whole source of spark-ckpt's join reads what Spark's two sources read together
    assert clicks["maxRowsPerTrigger"] + impressions["maxRowsPerTrigger"] == FULL.batch_rows


def test_every_line_reads_the_same_rows_per_micro_batch() -> None:
    table = {line.name: line for line in lines(QUICK)}
    assert list(table) == [
        "spark-ckpt/join",
        "spark-join",
        "count/today",
        "count/graph",
        "stages/spark-ckpt",
        "stages/spark",
        "stages/spark-pandas",
    ]
    assert table["spark-ckpt/join"].source == table["spark-join"].source
    assert table["count/today"].source == table["count/graph"].source
    for name in STAGE_LINES:  # the two-stage job reads the count lines' input
        assert table[name].source == table["count/today"].source
    assert table["count/today"].source["maxRowsPerTrigger"] == QUICK.batch_rows
    assert table["count/today"].source["seed"] == 7  # the clicks
    assert {pair for pair in RATIOS} <= {(a, b) for a in table for b in table}


def test_the_inputs_read_limits_add_up_to_the_inputs_sources(tmp_path: Path) -> None:
    """What the join lines rely on: the inputs' ``maxRowsPerTrigger`` add up to the read limit
    of the whole ``source=inputs`` (spark_ckpt ``5882cd6``), as :func:`join_sources` gives them."""
    generator = {"source": "generator", "channels": "2", "rate": "5000", "keys": "100000"}
    items = [
        {
            "name": n,
            "channels": 2,
            "key": "user_id",
            "time": None,
            "options": {**generator, "seed": s, "maxRowsPerTrigger": "150000"},
        }
        for n, s in (("clicks", "7"), ("impressions", "8"))
    ]
    opts = {
        **CheckpointConfig(interval_ms=1000).to_options(),
        "source": INPUTS_KIND,
        INPUTS: json.dumps(items),
        "pipeline": "bench",
        "store": str(tmp_path),
    }
    parsed = SourceOptions.parse(opts)
    assert parsed.max_rows_per_trigger == 300_000
    assert parsed.inputs is not None
    assert [i.name for i in parsed.inputs.inputs] == ["clicks", "impressions"]
    assert [i.max_rows_per_trigger for i in parsed.input_options] == [150_000, 150_000]


class FakeQuery:
    pass


def test_output_rows_of_a_spark_sink_sum_its_progress() -> None:
    started = GraphStarted(FakeQuery(), lambda: None)
    batches: list[dict[str, Any]] = [
        {"batchId": 0, "sink": {"numOutputRows": 0}},
        {"batchId": 1, "sink": {"numOutputRows": 120}},
        {"batchId": 2, "sink": {"numOutputRows": 30}},
    ]
    assert output_rows(started, batches) == 150
    batches.append({"batchId": 3, "sink": {"numOutputRows": -1}})  # a sink without the figure
    assert output_rows(started, batches) is None
    assert per_row(150, 300) == 0.5
    assert per_row(None, 300) is None and per_row(10, 0) is None


def run(variant: str, rows_per_s: float) -> dict[str, Any]:
    return {"variant": variant, "rows_per_s": rows_per_s}


def test_ratios_pair_the_lines_of_each_repetition() -> None:
    runs = [
        # rep 0 in the table's order, rep 1 reversed (ABBA)
        run("spark-ckpt/join", 120.0),
        run("spark-join", 100.0),
        run("count/today", 200.0),
        run("count/graph", 190.0),
        run("count/graph", 198.0),
        run("count/today", 200.0),
        run("spark-join", 100.0),
        run("spark-ckpt/join", 110.0),
    ]
    names = ["spark-ckpt/join", "spark-join", "count/today", "count/graph"]
    ratios = ratios_of(runs, names)
    join = ratios["spark-ckpt/join : spark-join"]
    assert join["per_rep"] == pytest.approx([1.2, 1.1])
    assert join["median"] == pytest.approx(1.15) and join["target"] == 1.0
    stage = ratios["count/graph : count/today"]
    assert stage["per_rep"] == pytest.approx([0.95, 0.99])
    assert stage["target"] == 0.97
    # a ratio whose lines did not both run is left out
    assert list(ratios_of(runs[:2], names[:2])) == ["spark-ckpt/join : spark-join"]


def test_output_rows_of_a_file_sink_are_those_of_its_committed_files(tmp_path: Path) -> None:
    """Spark's file sink reports no output rows (-1): its ``_spark_metadata`` log names the
    files it committed; a compaction repeats them, a file of no entry is not counted."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = tmp_path / "out dir"
    (out / "_spark_metadata").mkdir(parents=True)
    for name, n in (("a.parquet", 3), ("b.parquet", 5), ("c.parquet", 7), ("stray.parquet", 11)):
        pq.write_table(pa.table({"x": list(range(n))}), out / name)

    def entry(name: str, action: str = "add") -> str:
        uri = (out / name).as_uri()
        return json.dumps({"path": uri, "size": 1, "isDir": False, "action": action})

    log = out / "_spark_metadata"
    (log / "0").write_text("v1\n" + entry("a.parquet") + "\n")
    (log / "1").write_text("v1\n" + entry("b.parquet") + "\n" + entry("c.parquet") + "\n")
    (log / "1.compact").write_text("v1\n" + entry("a.parquet") + "\n" + entry("b.parquet") + "\n")
    (log / "2").write_text("v1\n" + entry("c.parquet", "delete") + "\n")
    (log / ".2.crc").write_text("ignored")
    assert file_sink_files(str(out)) == [str(out / "a.parquet"), str(out / "b.parquet")]
    started = GraphStarted(FakeQuery(), lambda: None, output=str(out), output_format="parquet")
    assert output_rows(started, [{"batchId": 0, "sink": {"numOutputRows": -1}}]) == 3 + 5


def test_the_two_stage_lines_and_their_ratios() -> None:
    """The two-stage job against Spark's chained aggregations (target >= 1.0); the line of
    ``applyInPandasWithState`` runs only when named."""
    assert [line.name for line in selected(QUICK)] == [
        line.name for line in lines(QUICK) if line.name != "stages/spark-pandas"
    ]
    only = replace_lines(("stages/spark-pandas", "stages/spark-ckpt"))
    assert [line.name for line in selected(only)] == ["stages/spark-ckpt", "stages/spark-pandas"]
    assert RATIOS[("stages/spark-ckpt", "stages/spark")] == 1.0
    runs = [
        run("stages/spark-ckpt", 300.0),
        run("stages/spark", 200.0),
        run("stages/spark", 250.0),
        run("stages/spark-ckpt", 250.0),
    ]
    ratio = ratios_of(runs, ["stages/spark-ckpt", "stages/spark"])[
        "stages/spark-ckpt : stages/spark"
    ]
    assert ratio["per_rep"] == pytest.approx([1.5, 1.0]) and ratio["target"] == 1.0
    users, countries = stages_job(3)
    assert (users.name, countries.name, countries.parallelism) == ("users", "countries", 3)
    assert users.operators[0].key_column == "user_id"
    assert countries.operators[0].key_column == "country"


def replace_lines(names: tuple[str, ...]) -> Any:
    from dataclasses import replace

    return replace(QUICK, lines=names)


def test_user_counts_emit_every_row_with_its_running_count_and_country() -> None:
    """spark-ckpt's first stage against a fold, over two batches (the state carries over)."""
    from spark_ckpt.state.backend import KeyedStateBackend
    from spark_ckpt.state.context import StateContext
    from spark_ckpt.state.keygroup import range_for_subtask

    op = UserCounts()
    backend = KeyedStateBackend(op.uid, 0, pa.int64(), range_for_subtask(128, 1, 0), 128)
    state = StateContext(backend)
    op.open(state)
    seen: dict[int, int] = {}
    for users in ([3, 53, 3, 7], [7, 3, 103]):
        n = len(users)
        batch = pa.table(
            {
                "user_id": pa.array(users, pa.int64()),
                "amount": pa.array(range(1, n + 1), pa.int64()),
                "event_ts": pa.array(range(n), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            }
        )
        out = op.process_batch(batch, state)
        assert out is not None and out.schema == op.output_schema
        expected = []
        for u in users:
            seen[u] = seen.get(u, 0) + 1
            expected.append(seen[u])
        assert out.column("count").to_pylist() == expected
        assert out.column("country").to_pylist() == [u % COUNTRIES for u in users]
        assert out.column("amount").to_pylist() == batch.column("amount").to_pylist()
        assert out.column("event_ts").to_pylist() == batch.column("event_ts").to_pylist()


class FakeGroupState:
    def __init__(self, value: int | None) -> None:
        self.exists = value is not None
        self.get = (value,)
        self.updated: tuple[int, ...] | None = None

    def update(self, value: tuple[int, ...]) -> None:
        self.updated = value


def test_spark_first_stage_counts_on_from_its_state() -> None:
    import pandas as pd

    frames = [
        pd.DataFrame({"user_id": [53, 53], "amount": [1, 2], "event_ts": [0, 1]}),
        pd.DataFrame({"user_id": [53], "amount": [5], "event_ts": [2]}),
    ]
    state = FakeGroupState(4)
    out = pd.concat(list(count_users((53,), iter(frames), state)), ignore_index=True)
    assert out["count"].tolist() == [5, 6, 7]
    assert out["country"].tolist() == [53 % COUNTRIES] * 3
    assert out["amount"].tolist() == [1, 2, 5]
    assert state.updated == (7,)


def test_window_sums_and_the_check_of_a_runs_windows() -> None:
    """The oracle folds tumbling windows aligned to the epoch; the check finds a wrong sum,
    a window twice and a due window missing, and forgives windows not yet due."""
    ms = [0, 4_999, 5_000, 12_000, 1_000]
    rows = pa.table(
        {
            "user_id": pa.array([1, 1, 1 + COUNTRIES, 2, 2], pa.int64()),
            "amount": pa.array([10, 20, 30, 40, 50], pa.int64()),
            "event_ts": pa.array([m * 1000 for m in ms], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
        }
    )
    oracle = window_sums(rows)
    assert oracle.values.tolist() == [
        [1, 0, WINDOW_MS, 30],
        [2, 0, WINDOW_MS, 50],
        [1, 5_000, 10_000, 30],
        [2, 10_000, 15_000, 40],
    ]
    due = 10_000  # the last window is not due yet
    assert compare_windows(oracle.iloc[:3], oracle, due)["ok"]
    report = compare_windows(oracle.iloc[:2], oracle, due)
    assert report["missing_due"] == 1 and not report["ok"]
    twice = compare_windows(oracle.iloc[[0, 1, 2, 2]], oracle, due)
    assert twice["duplicates"] == 1 and not twice["ok"]
    wrong = oracle.iloc[:3].copy()
    wrong.loc[0, "sum_amount"] = 31
    assert compare_windows(wrong, oracle, due)["wrong_sums"] == 1


def test_the_check_reads_a_bounded_copy_of_the_stage_lines_input() -> None:
    source = check_source(QUICK)
    count = next(line for line in lines(QUICK) if line.name == "stages/spark-ckpt").source
    assert source["rate"] == 0
    assert source["backlog"] == f"{CHECK_ROWS_PER_CHANNEL},{CHECK_ROWS_PER_CHANNEL}"
    assert {**source, "rate": 0, "backlog": 0} == {**count, "rate": 0, "backlog": 0}
    small = {**source, "backlog": "3,2"}
    assert generated_rows(small).num_rows == 5
