"""The state backends bench runs end to end in its smallest mode (no Spark anchor) and
writes every section of its JSON, for both backends; its figures are not asserted (no timed
assertions in tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "state_backends.py"


@pytest.mark.slow
def test_the_quick_bench_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "state_backends.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--no-spark", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert {"memory", "throughput", "checkpoints", "targets"} <= set(result)
    loads = list(_loads(result["memory"]))
    assert {load["backend"] for load in loads} == {"hashmap", "rocksdb"}
    for load in loads:
        points = load["points"]
        assert points and all(p["storage"]["backend"] == load["backend"] for p in points)
        assert points[-1]["storage"]["entries"] == points[-1]["keys"]
    for backend in ("hashmap", "rocksdb"):
        restore = result["checkpoints"][backend]["restore"]
        assert restore["keys"] > 0 and restore["blob_bytes"] > 0


def _loads(section: Any) -> Iterator[dict[str, Any]]:
    """The memory loads of the JSON, however it groups them (by backend, by mode)."""
    if isinstance(section, dict):
        if "points" in section and "backend" in section:
            yield section
            return
        for value in section.values():
            yield from _loads(value)
