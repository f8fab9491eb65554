"""The local Spark Connect server of ``connect_session("local[N]")``: this process's own,
reachable from this machine only.

Two scripts (``local_connect_job.py``) start a local Connect server each, at the same time,
and run a pipeline on it while the other's runs too. Each server listens on the loopback
address only — as the kernel's socket tables say — on a port of its own (not pyspark's fixed
15002), refuses a connection on the machine's other addresses, and refuses a client without
its token. Each pipeline's output is the running count of its input, exactly once: a plain
fold over the generator's rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import generated_keys, output_rows, read_delta, running_count_rows
from local_connect_job import SOURCE

from spark_ckpt.sources.generator import GeneratorSpec
from spark_ckpt.testing.processes import session_processes

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("local_connect_job.py")


def test_two_local_connect_sessions_listen_on_loopback_on_ports_of_their_own(
    tmp_path: Path,
) -> None:
    names = ("first", "second")
    jobs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), str(tmp_path), name, other],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for name, other in zip(names, reversed(names), strict=True)
    ]
    ports = []
    for job in jobs:
        try:
            _, err = job.communicate(timeout=600)
        finally:
            job.kill()
        assert job.returncode == 0, err[-4000:]
        assert not session_processes(job.pid), "a job left processes behind"
    for name in names:
        ready = json.loads((tmp_path / f"{name}.json").read_text())
        done = json.loads((tmp_path / f"{name}-done.json").read_text())
        port = ready["port"]
        ports.append(port)
        assert port != 15002
        assert ready["addresses"] == ["127.0.0.1"]  # nothing but loopback listens there
        # while this job's pipeline ran, the other server still listened, on loopback only
        assert done["other_listening"] == ["127.0.0.1"]
        assert "UNAUTHENTICATED" in done["refusal"]
        assert done["restarts"] == 0 and done["failures"] == 0
        spec = GeneratorSpec.from_options({k: str(v) for k, v in SOURCE.items()})
        expected = running_count_rows(generated_keys(spec, [SOURCE["backlog"]] * 2))
        assert output_rows(read_delta(tmp_path / f"{name}-out")) == expected
        # the machine's other addresses refused a connection to it
        assert all(done["elsewhere"].values()), done["elsewhere"]
    assert len(set(ports)) == 2
