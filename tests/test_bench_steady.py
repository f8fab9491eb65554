"""The benches' steady-state windows and spread statistics (``bench/runbench/steady.py``)
on hand-made query progress: the oracle is the arithmetic of the listed batches."""

from __future__ import annotations

import json
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from runbench.steady import (
    batch_rows,
    bootstrap_median_ci,
    drained_window,
    paired_ratios,
    spread,
    steady_window,
)

T0 = 1_800_000_000.0


def progress(batch_id: int, start_s: float, rows: int, ms: float) -> dict[str, Any]:
    stamp = datetime.fromtimestamp(T0 + start_s, tz=UTC)
    return {
        "batchId": batch_id,
        "timestamp": stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z",
        "numInputRows": rows,
        "durationMs": {"triggerExecution": ms},
    }


# batch 0 is empty, then batches of 100 rows every 0.5 s (batch 1 at 1.0 s)
BATCHES = [progress(0, 0.0, 0, 1000)] + [
    progress(i, 1.0 + 0.5 * (i - 1), 100, 500) for i in range(1, 30)
]


def test_steady_window_skips_warmup_batches_and_seconds() -> None:
    w = steady_window(BATCHES, warmup_batches=2, warmup_s=2.0, window_s=3.0)
    assert w is not None
    # first data batch starts at 1.0 s; 2 data batches skipped (1, 2) and 2 s must pass:
    # batch 5 starts at 3.0 s; batches starting before 6.0 s are 5..10, closed by batch 11
    assert (w.first, w.last) == (5, 10)
    assert w.rows == 600
    assert abs(w.seconds - 3.0) < 1e-6
    assert abs(w.rows_per_s - 200.0) < 1e-3


def test_steady_window_waits_for_the_closing_batch() -> None:
    assert steady_window(BATCHES[:11], warmup_batches=2, warmup_s=2.0, window_s=3.0) is None


def test_drained_window_ends_with_the_last_input_batch() -> None:
    # 1000 rows in all: batch 10 reads rows 901..1000; it ends 0.5 s after it starts (5.5 s)
    w = drained_window(BATCHES, warmup_batches=3, total_rows=1000)
    assert w is not None
    assert (w.first, w.last) == (4, 10)
    assert w.rows == 700
    assert abs(w.seconds - (6.0 - 2.5)) < 1e-6
    assert drained_window(BATCHES[:10], warmup_batches=3, total_rows=1000) is None
    with pytest.raises(ValueError, match="no measured window"):
        drained_window(BATCHES, warmup_batches=12, total_rows=1000)


def test_spread_and_paired_ratios() -> None:
    a, b = [9.0, 10.0, 11.0, 12.0], [10.0, 10.0, 10.0, 10.0]
    sp = spread(a)
    assert sp["median"] == 10.5 and sp["mean"] == 10.5 and sp["min"] == 9 and sp["max"] == 12
    assert sp["stdev"] == statistics.stdev(a)
    r = paired_ratios(a, b)
    assert r["per_rep"] == [0.9, 1.0, 1.1, 1.2]
    assert abs(r["median"] - 1.05) < 1e-12
    lo, hi = r["median_ci95"]
    assert 0.9 <= lo <= 1.05 <= hi <= 1.2
    assert abs(r["ci95_width"] - (hi - lo)) < 1e-12
    assert r["ratio_of_medians"] == 1.05


def test_bootstrap_interval_narrows_with_less_spread() -> None:
    wide = [0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15]
    narrow = [0.97, 0.975, 0.98, 0.98, 0.985, 0.99, 0.99]
    w, n = bootstrap_median_ci(wide), bootstrap_median_ci(narrow)
    assert w is not None and n is not None
    assert n[1] - n[0] < w[1] - w[0]
    assert bootstrap_median_ci([1.0]) is None


def test_batch_rows_come_from_the_source_positions() -> None:
    """On the executor path Spark counts the routed payloads as input rows (8 here): the rows
    read are the channels' positions moved between the start and the end offset."""
    end = {"v": 1, "positions": [300, 250], "emitted": [1, 1], "barriers": []}
    p = progress(3, 0.0, 8, 100) | {
        "sources": [
            {
                "startOffset": json.dumps({**end, "positions": [100, 200]}),
                "endOffset": json.dumps(end),
            }
        ]
    }
    assert batch_rows(p) == 250
    first = p | {"sources": [{"startOffset": None, "endOffset": end}]}
    assert batch_rows(first) == 550
    assert batch_rows(progress(3, 0.0, 8, 100)) == 8  # not a ckpt-source: Spark's count


def test_the_scaling_model_splits_a_batch_into_fixed_and_spread_cost() -> None:
    from dataclasses import replace

    from runbench.scaling import FULL, scaling_model

    s = replace(FULL, keys=(100,), batch_rows=1000)
    # one core: 1.0 s per batch of 1000 rows; two cores: 0.6 s -> fixed 0.2 s, work 0.8
    table = {
        "local[1] 100 keys": {"rows_per_s": {"v": {"median": 1000.0}}},
        "local[2] 100 keys": {"rows_per_s": {"v": {"median": 1000 / 0.6}}},
    }
    [(label, m)] = scaling_model(s, table, ["v"]).items()
    assert label == "v 100 keys"
    assert m["fixed_s_per_batch"] == pytest.approx(0.2)
    assert m["work_core_s_per_batch"] == pytest.approx(0.8)
    assert m["projected_rows_per_s"]["4"] == pytest.approx(1000 / (0.2 + 0.8 / 4))
    assert m["n_half"] == pytest.approx(4.0)
    assert m["ceiling_rows_per_s"] == pytest.approx(5000.0)


def test_an_alternating_window_holds_the_batches_that_start_in_it() -> None:
    from runbench.alternating import window_between, windows_order

    # batches start at 1.0, 1.5, ..., 10.5 s: [2.0, 4.0) holds 2.0 .. 3.5, closed by 4.0
    w = window_between(BATCHES, T0 + 2.0, T0 + 4.0)
    assert w is not None and (w.first, w.last) == (3, 6)
    assert (w.rows, w.seconds) == (400, pytest.approx(2.0))
    assert window_between(BATCHES, T0 + 2.0, T0 + 2.4) is None  # one batch: no rate
    assert window_between(BATCHES, T0 + 9.0, T0 + 99.0) is None  # no batch closes it
    assert windows_order(3) == [False, True, True, False, False, True]
