"""The state backends bench (``bench/state_backends.py``) in its smallest mode (``--quick``):
it runs, every measurement in its own process, and writes every section of its JSON. No
figure is asserted (a smoke run's figures tell nothing), only what the run must produce: the
sections, one entry per backend and size, and the restored state's checked sample."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "state_backends.py"
BACKENDS = ("hashmap", "rocksdb")


def run_quick(out: Path, *extra: str) -> dict[str, Any]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def check_common(result: dict[str, Any]) -> None:
    assert result["bench"] == "state_backends" and result["quick"] is True
    for key in ("date", "machine", "git", "settings", "load_average_start", "elapsed_s"):
        assert key in result
    assert {"cpu_count", "rocksdict", "pyarrow"} <= set(result["machine"])

    assert set(result["memory"]) == {"direct", "pipeline"}
    for mode, kind in itertools.product(result["memory"], BACKENDS):
        memory = result["memory"][mode][kind]
        assert memory["points"], (mode, kind)
        assert memory["mode"] == mode
        assert set(memory["bytes_per_key"]) == {str(p["keys"]) for p in memory["points"]}
        for point in memory["points"]:
            for key in ("rss_bytes", "bytes_per_key", "bytes_per_key_trimmed", "storage"):
                assert key in point
        assert "stopped" in memory and memory["largest_keys"] == memory["points"][-1]["keys"]

    settings = result["settings"]
    cases = result["throughput"]["cases"]
    expected = {str(k) for k in settings["key_spaces"]} | {
        f"{settings['prefilled_keys']}/prefilled"
    }
    for kind in BACKENDS:
        assert set(cases[kind]) == expected
        for entry in cases[kind].values():
            assert entry["rows_per_s_median"] > 0
            assert set(entry["runs"][0]["phase_s"]) == {"count", "get_values", "put_values"}

    for kind in BACKENDS:
        cp = result["checkpoints"][kind]
        assert cp["checkpoint"]["first_full"]["bytes_written"] > 0
        assert len(cp["checkpoint"]["incremental"]) == settings["churn_rounds"]
        assert cp["checkpoint"]["incremental_median"]["bytes_written"] > 0
        restore = cp["restore"]
        assert restore["sample_ok"] is True  # the restored state has the checkpoint's counts
        assert restore["entries"] == settings["checkpoint_keys"]
        assert restore["s_per_gb"] > 0

    names = [t["name"] for t in result["targets"]]
    assert result["memory"]["pipeline"]["rocksdb"]["points"][-1]["checkpoints"] > 0
    assert names == [
        "rocksdb RSS flat from 10M keys to 100M (direct)",
        "rocksdb RSS flat from 10M keys to 100M (pipeline)",
        "hashmap restore time per GB of checkpoint",
        "rocksdb restore time per GB of checkpoint",
    ]
    for t in result["targets"]:
        assert {"target", "value", "met"} <= set(t)


def test_quick_run_without_spark_writes_every_section(tmp_path: Path) -> None:
    result = run_quick(tmp_path / "state_backends.json", "--no-spark")
    check_common(result)
    assert "spark" not in result["throughput"]["cases"]
    assert result["throughput"]["ratios_to_spark"] == {}
    assert "--no-spark" in result["throughput"]["spark_anchor"]


@pytest.mark.spark
@pytest.mark.slow
def test_quick_run_with_spark_has_the_anchor_and_ratios(tmp_path: Path) -> None:
    result = run_quick(tmp_path / "state_backends.json")
    check_common(result)
    spark = result["throughput"]["cases"]["spark"]
    key_spaces = {str(k) for k in result["settings"]["key_spaces"]}
    assert set(spark) == key_spaces
    for entry in spark.values():
        assert entry["rows_per_s_median"] > 0
        assert entry["runs"][0]["batches"] == result["settings"]["measured_batches"]
    for kind in BACKENDS:
        assert set(result["throughput"]["ratios_to_spark"][kind]) == key_spaces
    assert "RocksDBStateStoreProvider" in str(result["throughput"]["spark_conf"])
