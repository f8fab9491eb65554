"""Run in-process tests on either state backend: :func:`use_state_backend` makes every keyed
state backend built in this process without an explicit storage (the state package's
tests), and every operator task's (the runtime's), use the backend named, so a test module
runs once per backend. :func:`parametrize_backends` is the ``pytest_generate_tests`` hook of
``tests/state`` and ``tests/runtime``: the modules it names run on both, the others on
``hashmap`` only (``make test``'s time limit; which and why: ``docs/state-backends.md``).
The ``rocksdb`` runs are marked ``slow``: ``make test`` runs them, ``make test-fast`` does
not."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import pyarrow as pa
import pytest

from spark_ckpt.state import backend as backend_module
from spark_ckpt.state.backends.rocksdb import RocksDBOptions
from spark_ckpt.state.backends.spec import StateBackendSpec, StateBackendType
from spark_ckpt.state.backends.table import StateStorage

#: The backends a parametrized test runs on.
BACKENDS = ("hashmap", "rocksdb")
#: Small memory per instance: a test builds many backends.
_TEST_BUFFER_BYTES = 1 << 20


#: A protocol model test runs this share of its examples on ``rocksdb`` (:func:`examples`).
ROCKSDB_EXAMPLES = 0.2


def examples(full: int, backend: str) -> int:
    """How many Hypothesis examples a model test that drives whole tasks through crashes
    runs on *backend*: *full* on ``hashmap``, a fifth (at least 10) on ``rocksdb``, which
    those tests reach for its storage of nested values (already checked against
    ``hashmap`` by the state package's equivalence test), not for new protocol paths."""
    if backend == StateBackendType.HASHMAP.value:
        return full
    return max(10, round(full * ROCKSDB_EXAMPLES))


def use_state_backend(monkeypatch: pytest.MonkeyPatch, name: str, local_dir: str) -> None:
    """Make *name* the storage of every backend built from now on in this process (the
    ``rocksdb`` instances under *local_dir*). ``hashmap`` is the default: nothing changes."""
    if name == StateBackendType.HASHMAP.value:
        return
    spec = StateBackendSpec(
        StateBackendType(name),
        RocksDBOptions(local_dir, _TEST_BUFFER_BYTES, _TEST_BUFFER_BYTES),
    )
    real = StateBackendSpec.storage

    def storage(operator_uid: str, subtask: int, key_type: pa.DataType) -> StateStorage:
        return real(spec, operator_uid, subtask, key_type)

    def any_spec(_self: StateBackendSpec, uid: str, subtask: int, kt: pa.DataType) -> StateStorage:
        return storage(uid, subtask, kt)

    monkeypatch.setattr(backend_module, "default_storage", storage)
    monkeypatch.setattr(StateBackendSpec, "storage", any_spec)


def parametrize_backends(metafunc: pytest.Metafunc, both: Collection[str]) -> None:
    """Parametrize the ``state_backend`` fixture: both backends for the test modules named
    in *both*, ``hashmap`` for the others."""
    if "state_backend" not in metafunc.fixturenames:
        return
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    names: list[Any] = ["hashmap"]
    if module in both:  # the second run is the suite's, not the quick check's (make test-fast)
        names.append(pytest.param("rocksdb", marks=pytest.mark.slow))
    metafunc.parametrize("state_backend", names, indirect=True)
