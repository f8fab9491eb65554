"""The job's own operator classes travel to the executors by value: a process that cannot
import their module unpickles them; installed libraries and spark-ckpt stay by reference."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from spark_ckpt.runtime.operator import RunningCount
from spark_ckpt.spark.executors.shipping import job_modules, ship_by_value

JOB_CODE = '''
import pyarrow as pa
from spark_ckpt import KeyedOperator, RunningCount


class Doubled(KeyedOperator):
    """Wraps another operator (as a user's wrapper would)."""

    def __init__(self, inner):
        super().__init__(inner.uid, inner.key_column, inner.key_type)
        self.inner = inner

    def process_batch(self, batch, state):
        return self.inner.process_batch(batch, state)
'''


@pytest.fixture
def job_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    (tmp_path / "myjob_ops.py").write_text(JOB_CODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import myjob_ops  # type: ignore[import-not-found]

    yield myjob_ops
    sys.modules.pop("myjob_ops", None)


def test_the_jobs_own_modules_are_found_and_libraries_are_not(job_module: object) -> None:
    inner = RunningCount("counter", "user_id")
    wrapped = job_module.Doubled(inner)  # type: ignore[attr-defined]
    assert [m.__name__ for m in job_modules([wrapped, inner, pa.int64()])] == ["myjob_ops"]
    assert job_modules([inner, object()]) == []


def test_shipped_operators_unpickle_where_their_module_is_missing(
    job_module: object, tmp_path: Path
) -> None:
    from pyspark import cloudpickle

    wrapped = job_module.Doubled(RunningCount("counter", "user_id"))  # type: ignore[attr-defined]
    assert ship_by_value([wrapped]) == ["myjob_ops"]
    payload = tmp_path / "op.pickle"
    payload.write_bytes(cloudpickle.dumps(wrapped))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    check = textwrap.dedent(
        f"""
        import pickle
        op = pickle.loads(open({str(payload)!r}, "rb").read())
        print(type(op).__name__, type(op.inner).__module__, op.uid)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", check], cwd=elsewhere, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["Doubled", "spark_ckpt.runtime.operator", "counter"]
