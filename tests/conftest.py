"""The root of the test suite: how two pytest-xdist workers share the machine (``make test``
and ``make test-fast`` both run ``-n 2``).

Most tests can run side by side, the ones that start a local Spark Connect server included
(each listens on a free port of its own). One kind cannot, and runs on one worker, one test
after the other (a scope of xdist's scheduler): ``local-cluster`` — ``test_executor_faults.py``
and the time crash test that kills executor JVMs: a local cluster's executors work under
``$SPARK_HOME/work``, shared by every local cluster on the machine, which those tests read and
clear.

(xdist's own ``xdist_group`` marker has no effect with pytest 9: it renames the items'
``_nodeid``, which pytest 9 no longer reads.)

The suite is CPU-bound, and most of its CPU goes to Spark jobs, whose start (a JVM and its
Python processes) costs far more than their micro-batches: so long tests start first
(:func:`start_rank`), the jobs' JVMs start with :mod:`spark_ckpt.testing.jvm`'s options,
their Python processes without ``pyspark.zip`` (:mod:`spark_ckpt.spark.session.spark_home`)
and with the project's bytecode compiled beforehand (``make bytecode``), and a local Spark's
streaming checkpoints spawn no ``readlink`` (:mod:`spark_ckpt.spark.session.builders`).
Timings and where the CPU goes: README.md, *Development*.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

from spark_ckpt.testing.s3_endpoint import S3Endpoint, running_s3_endpoint

# Property tests assert what holds, never how fast: no per-example deadline (the suite shares
# two cores with Spark's JVMs, where one example may take seconds).
settings.register_profile("spark-ckpt", deadline=None)
settings.load_profile("spark-ckpt")


def xdist_scope(nodeid: str) -> str:
    """The scheduling scope of test *nodeid*: a shared name for the tests that must not run
    beside each other, the test itself otherwise."""
    if "test_executor_faults.py" in nodeid or "executor_jvms_are_killed" in nodeid:
        return "local-cluster"
    return nodeid


def start_rank(item: pytest.Item) -> int:
    """When a single-test scope starts under xdist, earliest first: the slow tests, then the
    other Spark tests, then the quick ones, which fill the workers' gaps at the end instead of
    leaving one worker alone with a long test. (The serial chains of :func:`xdist_scope` start
    before all of them: xdist's scope scheduler queues the scopes with the most tests first.)"""
    if item.get_closest_marker("slow") is not None:
        return 0
    if item.get_closest_marker("spark") is not None:
        return 1
    return 2


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the tests by :func:`start_rank` (stable: collection order within a rank; the same
    on every worker, as xdist requires). A test's outcome never depends on the order."""
    items.sort(key=start_rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``-n N`` (``--dist load``, the default): load balancing by :func:`xdist_scope`."""
    if config.getvalue("dist") not in ("load", "loadgroup", "loadscope"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByScope(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return ByScope(config, log)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[S3Endpoint]:
    """A real S3 endpoint (moto's server) for this test worker; each module that uses it
    creates its own bucket."""
    with running_s3_endpoint() as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def s3(s3_endpoint: S3Endpoint, request: pytest.FixtureRequest) -> S3Endpoint:
    """:func:`s3_endpoint` with the bucket the test module names (its ``BUCKET``)."""
    s3_endpoint.create_bucket(request.module.BUCKET)
    return s3_endpoint


@pytest.fixture
def on_s3(s3: S3Endpoint, s3_environment: None) -> S3Endpoint:
    """:func:`s3`, with this test process's pyarrow and delta-rs pointed at it."""
    return s3


@pytest.fixture
def s3_environment(s3_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """This test process's pyarrow and delta-rs pointed at :func:`s3_endpoint`."""
    for key, value in s3_endpoint.environment().items():
        monkeypatch.setenv(key, value)
