"""The state backend of this folder's tests (:mod:`spark_ckpt.testing.state_backends`):
the modules in :data:`BOTH` run on ``hashmap`` and ``rocksdb``, the others on ``hashmap``."""

from __future__ import annotations

import pytest

from spark_ckpt.testing.state_backends import parametrize_backends, use_state_backend

#: The modules that run on both state backends.
BOTH = frozenset({"test_task_timers", "test_windows", "test_subtask_image"})


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_backends(metafunc, BOTH)


@pytest.fixture(autouse=True)
def state_backend(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> str:
    name: str = request.param
    use_state_backend(monkeypatch, name, str(tmp_path_factory.mktemp("rocksdb")))
    return name
