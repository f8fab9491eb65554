"""The graphs bench's arithmetic and options (``bench/runbench/graphbench.py``,
``bench/runbench/graph_variants.py``) on hand-made query progress and options, without Spark:
the oracle is the arithmetic of the listed batches, options and rows/s."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from runbench.graph_variants import GraphStarted
from runbench.graphbench import (
    FULL,
    QUICK,
    RATIOS,
    file_sink_files,
    join_sources,
    lines,
    output_rows,
    per_row,
    ratios_of,
)
from runbench.steady import batch_rows

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
    assert list(table) == ["spark-ckpt/join", "spark-join", "count/today", "count/graph"]
    assert table["spark-ckpt/join"].source == table["spark-join"].source
    assert table["count/today"].source == table["count/graph"].source
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
