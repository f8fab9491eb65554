"""The chaos benchmark (``bench/chaos.py``) in small: 6 random faults — one shuffled round of
every kind — over an aligned and an unaligned job (at-least-once under SIGKILLs:
``test_crash.py``; the benchmark runs all three modes), each fault injected
after the job recovered from the previous one, while the run appends input; then stop, drain
and compare with the oracle.

The oracle is the input the run wrote (``ModeResult.written``), nothing the code under test
computed. The benchmark reads the output with ``deltalake``; this test reads it a second time
with the Delta log replay of :func:`conftest.read_delta` and compares it with
:func:`conftest.running_count_rows`: nothing lost anywhere, and exactly the expected rows in
the exactly-once modes (at-least-once may duplicate).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import DemoLauncher, output_rows, read_delta, running_count_rows

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FAULTS = 6
MODES = ("aligned", "unaligned")
SEED = 7


def load_chaos() -> ModuleType:
    """``bench/chaos.py`` as a module (``bench`` is not a package)."""
    path = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"
    spec = importlib.util.spec_from_file_location("bench_chaos", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_random_faults_keep_the_output_exactly_once(demo: DemoLauncher) -> None:
    chaos = load_chaos()
    settings = chaos.Settings(faults=FAULTS, modes=MODES, seed=SEED, gap_s=(0.5, 2.0))
    result = chaos.run_chaos(settings, demo, log=print)
    rep = chaos.report(result)
    summary = chaos.render({**rep, "machine": {}})
    assert not result.misses(), summary

    faults = [f for m in result.modes for f in m.faults]
    assert len(faults) >= FAULTS, summary
    injected = {f.kind for f in faults}
    assert injected == set(chaos.KINDS), summary  # every kind occurs (shuffled rounds)
    assert {f.kind for f in faults if f.hit} == injected, summary

    for mode in result.modes:
        expected = running_count_rows(mode.written)
        actual = output_rows(read_delta(Path(mode.output)))
        assert mode.rows_in == expected.total() > 0
        assert not expected - actual, f"{mode.mode}: lost {sorted(expected - actual)[:10]}"
        if mode.exactly_once:  # at-least-once may duplicate
            assert actual == expected, f"{mode.mode}: extra {sorted(actual - expected)[:10]}"
