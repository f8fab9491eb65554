"""Fault injection: the one place that lists every fail point, and how to switch them on.

Fail points live in faulty versions of a pipeline's components, never in the shipped code: a
job that names :data:`COMPONENTS` (``components="spark_ckpt.testing.faults:FAULTY"``; see
:mod:`spark_ckpt.runtime.components`) runs its store, sink committer, channel source and
operators wrapped by the classes below, in every process where they run. The main job with
them is :mod:`spark_ckpt.testing.faulty_job` (what :mod:`spark_ckpt.testing.jobs` launches).

A fail point fires when it is *armed* for the pipeline root: :func:`arm` writes
``<root>/_faults/<name>.json`` saying what to do and how often. Every hit claims one of the
armed ``times`` by creating ``<name>.hit.<n>`` exclusively (atomic across processes), writes
a JSON record of the situation into it, then acts:

* ``kill`` — ends the process at once with :func:`os._exit` (status 137, as SIGKILL: no
  cleanup, no ``finally``);
* ``raise`` — raises the configured error: ``store`` a
  :class:`~spark_ckpt.errors.StoreError`, ``enospc`` / ``eacces`` a ``StoreError`` caused by
  ``OSError(ENOSPC / EACCES)`` (what the storage adapters make of a full disk or a denied
  write), ``operator`` an :class:`InjectedFault`.

``times=ALWAYS`` fires on every hit; :func:`disarm` removes the marker (storage "returns").
:func:`hits` reads the records back.

========================  =====================  ============================================
name                      where                  what it simulates
========================  =====================  ============================================
``before-sink-commit``    committer, before the  the coordinator dies between completing a
                          global sink commit     checkpoint and committing its output
``sink-commit``           committer, the         the global committer's Delta commit fails
                          global sink commit     (the coordinator's thread stops)
``store-commit``          store, storing a       the completed-checkpoint commit fails
                          completed checkpoint   (checkpoint fails: FINALIZE_FAILED)
``store-write``           store, a task writing  checkpoint storage fails for the tasks (the
                          its state              task declines the checkpoint)
``source-runner``         source, its heads      Spark's Python streaming source runner dies
                          (``latestOffset``)
``source-read``           source, reading a      a Python worker dies while reading
                          plan (``read()``)
``operator``              a user operator        the user's code raises (``error="operator"``)
========================  =====================  ============================================
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any, cast

import pyarrow as pa

from spark_ckpt.errors import SparkCkptError, StoreError
from spark_ckpt.runtime.co_operator import KeyedCoOperator
from spark_ckpt.runtime.components import Components
from spark_ckpt.runtime.operator import KeyedOperator
from spark_ckpt.sinks.two_phase_commit import SinkCommitter, Transaction
from spark_ckpt.sources.channel_source import ChannelSource, ReadPlan, read_rows
from spark_ckpt.state.context import StateContext
from spark_ckpt.storage.checkpoint_store import CheckpointStore

#: Directory under the pipeline root holding armed faults and their hit records.
FAULTS_DIR = "_faults"
#: Exit status of a process killed by a fail point (as if by SIGKILL).
KILL_EXIT_CODE = 137
#: ``times`` for a fault that fires on every hit.
ALWAYS = -1


class Fault(StrEnum):
    BEFORE_SINK_COMMIT = "before-sink-commit"
    SINK_COMMIT = "sink-commit"
    STORE_COMMIT = "store-commit"
    STORE_WRITE = "store-write"
    SOURCE_RUNNER = "source-runner"
    SOURCE_READ = "source-read"
    OPERATOR = "operator"


class Action(StrEnum):
    KILL = "kill"
    RAISE = "raise"


class InjectedFault(SparkCkptError):
    """The error an armed ``raise`` fail point with ``error="operator"`` raises."""


def _dir(root: str) -> str | None:
    return None if "://" in root else os.path.join(root, FAULTS_DIR)


def arm(
    root: str,
    fault: Fault,
    action: Action = Action.KILL,
    *,
    times: int = 1,
    error: str = "store",
) -> None:
    """Arm *fault* for the pipeline root *root* (local roots only): it fires on its next
    *times* hits (:data:`ALWAYS`: every hit). Re-arming resets the count and forgets earlier
    hit records."""
    directory = _dir(root)
    if directory is None:
        raise SparkCkptError("fail points need a local pipeline root")
    os.makedirs(directory, exist_ok=True)
    disarm(root, fault)
    _forget_hits(directory, fault)
    tmp = os.path.join(directory, f".{fault.value}.tmp")
    with open(tmp, "w") as f:
        json.dump({"action": action.value, "times": times, "error": error}, f)
    os.replace(tmp, os.path.join(directory, f"{fault.value}.json"))


def disarm(root: str, fault: Fault) -> None:
    """Remove the marker of *fault* (idempotent); its hit records stay readable. Records
    stay so that a process that read the marker just before cannot claim the fault again."""
    directory = _dir(root)
    if directory is None:
        return
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(directory, f"{fault.value}.json"))


def _forget_hits(directory: str, fault: Fault) -> None:
    for name in os.listdir(directory):
        if name.startswith(f"{fault.value}.hit."):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(directory, name))


def hits(root: str, fault: Fault) -> list[dict[str, Any]]:
    """The records of the hits of *fault* so far, in claim order."""
    directory = _dir(root)
    if directory is None or not os.path.isdir(directory):
        return []
    prefix = f"{fault.value}.hit."
    numbered = sorted(
        (int(n[len(prefix) :]), n) for n in os.listdir(directory) if n.startswith(prefix)
    )
    out = []
    for _, name in numbered:
        try:
            with open(os.path.join(directory, name)) as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            out.append({})  # claimed, record not written yet (or the process died first)
    return out


def _claim(directory: str, fault: Fault, times: int) -> str | None:
    n = 0
    while times == ALWAYS or n < times:
        path = os.path.join(directory, f"{fault.value}.hit.{n}")
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            n += 1
            continue
        os.close(fd)
        return path
    return None


def _error(kind: str, fault: Fault) -> BaseException:
    message = f"injected fault {fault.value}"
    if kind in ("enospc", "eacces"):
        code = errno.ENOSPC if kind == "enospc" else errno.EACCES
        cause = OSError(code, f"{os.strerror(code)} ({message})")
        error = StoreError(f"{message}: {cause}")
        error.__cause__ = cause
        return error
    if kind == "operator":
        return InjectedFault(message)
    return StoreError(message)


def hit(root: str, fault: Fault, record: Callable[[], Mapping[str, object]] | None = None) -> None:
    """A fail point: does nothing unless *fault* is armed for *root* with hits left; then
    records the hit and acts (module docstring)."""
    directory = _dir(root)
    if directory is None:
        return
    try:
        with open(os.path.join(directory, f"{fault.value}.json")) as f:
            spec = json.load(f)
    except (OSError, ValueError):
        return
    claimed = _claim(directory, fault, int(spec.get("times", 1)))
    if claimed is None:
        return
    details = {
        "name": fault.value,
        "pid": os.getpid(),
        "time_ms": time.time_ns() // 1_000_000,
        **(record() if record else {}),
    }
    with open(claimed, "w") as f:
        json.dump(details, f)
        f.flush()
        os.fsync(f.fileno())
    if spec.get("action") == Action.KILL.value:
        os._exit(KILL_EXIT_CODE)
    raise _error(str(spec.get("error", "store")), fault)


class FaultyStore:
    """A checkpoint store whose completion commits (``store-commit``) and task-state writes
    (``store-write``) pass fail points."""

    def __init__(self, store: CheckpointStore, root: str) -> None:
        self._store = store
        self._root = root

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        hit(self._root, Fault.STORE_COMMIT)
        return self._store.commit(*args, **kwargs)

    def write_task_state(self, *args: Any, **kwargs: Any) -> Any:
        hit(self._root, Fault.STORE_WRITE)
        return self._store.write_task_state(*args, **kwargs)


class FaultyCommitter:
    """A sink's global committer whose ``commit_checkpoint`` passes ``before-sink-commit``
    (recording what the sink had committed) and ``sink-commit``."""

    def __init__(self, committer: SinkCommitter, root: str) -> None:
        self._committer = committer
        self._root = root

    def __getattr__(self, name: str) -> Any:
        return getattr(self._committer, name)

    def commit_checkpoint(self, checkpoint_id: int, txns: Sequence[Transaction]) -> bool:
        inner = self._committer
        hit(
            self._root,
            Fault.BEFORE_SINK_COMMIT,
            lambda: {
                "checkpoint_id": checkpoint_id,
                "sink_committed": inner.committed_checkpoint(),
            },
        )
        hit(self._root, Fault.SINK_COMMIT, lambda: {"checkpoint_id": checkpoint_id})
        return inner.commit_checkpoint(checkpoint_id, txns)


class FaultyPlan:
    """A read plan that passes ``source-read`` where it is read (an executor's Python
    worker, in ``read()``). Picklable when the plan it wraps is."""

    def __init__(self, plan: ReadPlan, root: str) -> None:
        self.plan = plan
        self.root = root

    @property
    def channel(self) -> int:
        return self.plan.channel

    @property
    def start(self) -> int:
        return self.plan.start

    @property
    def end(self) -> int:
        return self.plan.end

    def read_positioned(self) -> tuple[pa.Table, pa.Array | None]:
        hit(self.root, Fault.SOURCE_READ, lambda: {"channel": self.channel})
        return read_rows(self.plan)

    def read(self) -> pa.Table:
        return self.read_positioned()[0]


class FaultySource:
    """A channel source whose ``heads`` pass ``source-runner`` (Spark's source runner, in
    ``latestOffset``) and whose plans pass ``source-read`` (:class:`FaultyPlan`)."""

    def __init__(self, source: ChannelSource, root: str) -> None:
        self._source = source
        self._root = root

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    @property
    def channels(self) -> int:
        return self._source.channels

    @property
    def schema(self) -> pa.Schema:
        return self._source.schema

    def heads(self) -> list[int]:
        hit(self._root, Fault.SOURCE_RUNNER)
        return self._source.heads()

    def plan(self, channel: int, start: int, end: int) -> ReadPlan:
        return FaultyPlan(self._source.plan(channel, start, end), self._root)


class _Delegated:
    """What a faulty operator hands to the operator it wraps unchanged (its schemas, its
    lifecycle, its timers behind the ``operator`` fail point)."""

    inner: KeyedOperator
    root: str

    @property
    def output_schema(self) -> pa.Schema | None:
        return self.inner.output_schema

    @property
    def side_outputs(self) -> Mapping[str, pa.Schema]:
        return self.inner.side_outputs

    def open(self, state: StateContext) -> None:
        self.inner.open(state)

    @property
    def handles_timers(self) -> bool:
        return self.inner.handles_timers

    def on_timers(self, timers: pa.Table, state: StateContext) -> pa.Table | None:
        hit(self.root, Fault.OPERATOR, lambda: {"timers": timers.num_rows})
        return self.inner.on_timers(timers, state)

    def close(self) -> None:
        self.inner.close()


class FaultyOperator(_Delegated, KeyedOperator):
    """*inner* with the ``operator`` fail point before each batch it processes and each round
    of its timers (same uid, key, state and timers: a job restores it like *inner*)."""

    def __init__(self, inner: KeyedOperator, root: str) -> None:
        super().__init__(inner.uid, inner.key_column, inner.key_type)
        self.inner = inner
        self.root = root

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        hit(self.root, Fault.OPERATOR, lambda: {"rows": batch.num_rows})
        return self.inner.process_batch(batch, state)


class FaultyCoOperator(_Delegated, KeyedCoOperator):
    """*inner*, an operator over several inputs, with the ``operator`` fail point before
    each micro-batch and each round of its timers (same uid, keys, state and timers)."""

    inner: KeyedCoOperator

    def __init__(self, inner: KeyedCoOperator, root: str) -> None:
        super().__init__(inner.uid, inner.keys, inner.key_type, inner.key_column)
        self.inner = inner
        self.root = root

    def bind_inputs(self, schemas: Mapping[str, pa.Schema]) -> None:
        bind = getattr(self.inner, "bind_inputs", None)
        if bind is not None:
            bind(schemas)

    def process_inputs(
        self, batches: Mapping[str, pa.Table], state: StateContext
    ) -> pa.Table | None:
        hit(self.root, Fault.OPERATOR, lambda: {"rows": sum(t.num_rows for t in batches.values())})
        return self.inner.process_inputs(batches, state)


class FaultyComponents(Components):
    """Every component with its fail points (module docstring)."""

    def store(self, store: CheckpointStore, root: str) -> CheckpointStore:
        return cast(CheckpointStore, FaultyStore(store, root))

    def committer(self, committer: SinkCommitter, root: str) -> SinkCommitter:
        return cast(SinkCommitter, FaultyCommitter(committer, root))

    def source(self, source: ChannelSource, root: str) -> ChannelSource:
        return FaultySource(source, root)

    def operator(self, operator: KeyedOperator, root: str) -> KeyedOperator:
        if isinstance(operator, KeyedCoOperator):
            return FaultyCoOperator(operator, root)
        return FaultyOperator(operator, root)


#: The components with fail points, as a job names them.
FAULTY = FaultyComponents()
#: The name a job gives to run with :data:`FAULTY` (``components=COMPONENTS``).
COMPONENTS = f"{__name__}:FAULTY"
