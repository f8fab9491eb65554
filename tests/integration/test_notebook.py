"""The quickstart notebook runs as written (its code cells, in order, with small parameters),
so the notebook stays true to the code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "quickstart.ipynb"


@pytest.mark.spark
@pytest.mark.slow
def test_quickstart_notebook_runs(spark: Any, tmp_path: Path) -> None:
    cells = [c for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
    namespace: dict[str, Any] = {"spark": spark}
    params = {
        "PIPELINE": "notebook_test",
        "ROOT": str(tmp_path / "root"),
        "OUTPUT": str(tmp_path / "counts"),
        "RUN_SECONDS": 6,
    }
    for i, cell in enumerate(cells):
        source = "".join(cell["source"])
        exec(compile(source, f"{NOTEBOOK.name}[{i}]", "exec"), namespace)
        if i == 0:  # the parameter cell
            assert set(params) <= namespace.keys()
            namespace.update(params)
    out = namespace["out"]
    final = namespace["final"]
    assert final is not None and out.height > 0
    # every committed (user_id, count) appears once and counts are gapless per key
    pairs = list(zip(out["user_id"].to_list(), out["count"].to_list(), strict=True))
    assert len(pairs) == len(set(pairs))
    by_key: dict[int, list[int]] = {}
    for k, n in pairs:
        by_key.setdefault(k, []).append(n)
    assert all(sorted(v) == list(range(1, len(v) + 1)) for v in by_key.values())
