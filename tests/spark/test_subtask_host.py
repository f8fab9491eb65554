"""Subtask hosts as real processes, with a stand-in for the subtask's micro-batch: one host
keeps a subtask between micro-batches, its errors reach the task with their type, a host
killed mid-batch fails the task and the next micro-batch starts a new one, and a host ends
with its executor, when idle, or at once when another host holds its address."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark import cloudpickle

from spark_ckpt.coordination.heartbeats import process_exists
from spark_ckpt.errors import EnvironmentSetupError, StateError
from spark_ckpt.spark.executors.executor_cache import CacheKey, Fence
from spark_ckpt.spark.executors.subtask_errors import SubtaskHostError, SubtaskHostLostError
from spark_ckpt.spark.executors.subtask_host import (
    BatchDone,
    BatchFailed,
    MicroBatch,
    SubtaskHosts,
    _sweep,
    host_address,
    host_directory,
)
from spark_ckpt.spark.session.environment import (
    ARROW_MIMALLOC_PURGE_DELAY,
    DELTA_JEMALLOC_CONF,
    HOST_JEMALLOC_CONF,
    TOKIO_WORKER_THREADS,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: micro-batches this process ran (in a host: since it started)
_RAN: list[int] = []


@dataclass(frozen=True)
class Counter:
    """Stands in for SubtaskFunction: counts the micro-batches its process ran; *fail* makes
    it raise, *die* kills its process, both at the given batch."""

    fail: int = -1
    die: int = -1
    #: a file whose existence says the run is over
    ended: str = ""
    #: a file the host's close() of this runner writes (its micro-batches, one per line)
    closed: str = ""

    def run_ended(self) -> bool:
        return bool(self.ended) and os.path.exists(self.ended)

    def close(self) -> None:
        if self.closed:
            Path(self.closed).write_text("".join(f"{n}\n" for n in _RAN))

    def run_batch(self, batch: MicroBatch, payloads: list[bytes]) -> BatchDone:
        if batch.batch_id == self.die:
            os.kill(os.getpid(), signal.SIGKILL)
        if batch.batch_id == self.fail:
            raise StateError(f"no state for batch {batch.batch_id}")
        if batch.batch_id == self.fail + 100:
            raise KeyError("not ours")
        _RAN.append(batch.batch_id)
        fence = Fence("run-1", batch.batch_id, batch.token, f"pid-{os.getpid()}")
        return BatchDone(fence, sum(len(p) for p in payloads), str(len(_RAN)), 0.0)


def batch(n: int) -> MicroBatch:
    return MicroBatch(0, n, f"t{n}", "exec-1", Fence("run-1", n - 1, "x", "exec-1"))


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def key(tmp_path: Path) -> CacheKey:
    return CacheKey(str(tmp_path / "root"), f"run-{tmp_path.name}", 0)


def host_pid(done: BatchDone) -> int:
    return int(done.fence.executor.removeprefix("pid-"))


def wait_gone(hosts: SubtaskHosts, pid: int, what: str) -> None:
    """Wait until process *pid* (a host *hosts* started) has ended and been collected: a
    killed process holds its files until its last thread ended."""

    def gone() -> bool:
        hosts._reap()
        return not process_exists(pid) and not Path(f"/proc/{pid}").exists()

    wait_until(gone, what)


def test_the_messages_round_trip() -> None:
    b = batch(3)
    assert MicroBatch.from_json(b.to_json()) == b
    first = MicroBatch(1, 0, "t", "e", None)
    assert MicroBatch.from_json(first.to_json()) == first
    done = BatchDone(Fence("r", 1, "t", "e"), 5, "hit", 1.5)
    assert BatchDone.from_json(done.to_json()) == done
    failed = BatchFailed("StateError", "boom")
    assert BatchFailed.from_json(failed.to_json()) == failed
    assert isinstance(failed.exception(), StateError)
    assert isinstance(BatchFailed("KeyError", "k").exception(), SubtaskHostError)


def test_one_host_keeps_the_subtask_between_micro_batches(key: CacheKey) -> None:
    hosts = SubtaskHosts(idle_s=30)
    first = hosts.run(key, Counter(), batch(1), [b"abc"])
    second = SubtaskHosts(idle_s=30).run(key, Counter(), batch(2), [b"de", b"f"])  # another worker
    assert host_pid(first) == host_pid(second) != os.getpid()
    assert (first.outcome, second.outcome) == ("1", "2")  # the host kept its count
    assert (first.rows, second.rows) == (3, 3)
    assert _RAN == []  # nothing ran in the task's process
    os.kill(host_pid(second), signal.SIGKILL)


@pytest.mark.parametrize("chosen", [None, "2"])
def test_a_host_runs_delta_rs_on_one_worker_unless_the_user_chose(
    key: CacheKey, chosen: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host starts with ``TOKIO_WORKER_THREADS=1`` (its checkpoint writes are small
    Delta commits) unless the worker's environment sets a count."""
    if chosen is None:
        monkeypatch.delenv(TOKIO_WORKER_THREADS, raising=False)
    else:
        monkeypatch.setenv(TOKIO_WORKER_THREADS, chosen)
    done = SubtaskHosts(idle_s=30).run(key, Counter(), batch(1), [])
    environ = Path(f"/proc/{host_pid(done)}/environ").read_bytes().split(b"\0")
    assert f"{TOKIO_WORKER_THREADS}={chosen or '1'}".encode() in environ
    assert os.environ.get(TOKIO_WORKER_THREADS) == chosen  # the worker's own is untouched
    os.kill(host_pid(done), signal.SIGKILL)


@pytest.mark.parametrize("chosen", [None, "dirty_decay_ms:5000"])
def test_a_host_hands_freed_memory_back_unless_the_user_chose(
    key: CacheKey, chosen: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host starts with delta-rs's jemalloc purging freed pages after 1 s and Arrow's
    mimalloc at once (``docs/state-backends.md``), unless the worker's environment sets
    jemalloc's options; the worker's own environment is untouched."""
    if chosen is None:
        monkeypatch.delenv(DELTA_JEMALLOC_CONF, raising=False)
    else:
        monkeypatch.setenv(DELTA_JEMALLOC_CONF, chosen)
    monkeypatch.delenv(ARROW_MIMALLOC_PURGE_DELAY, raising=False)
    done = SubtaskHosts(idle_s=30).run(key, Counter(), batch(1), [])
    environ = Path(f"/proc/{host_pid(done)}/environ").read_bytes().split(b"\0")
    assert f"{DELTA_JEMALLOC_CONF}={chosen or HOST_JEMALLOC_CONF}".encode() in environ
    assert f"{ARROW_MIMALLOC_PURGE_DELAY}=0".encode() in environ
    assert os.environ.get(DELTA_JEMALLOC_CONF) == chosen
    os.kill(host_pid(done), signal.SIGKILL)


def test_an_error_reaches_the_task_with_its_type_and_the_host_goes_on(key: CacheKey) -> None:
    hosts = SubtaskHosts(idle_s=30)
    first = hosts.run(key, Counter(fail=2), batch(1), [])
    with pytest.raises(StateError, match="no state for batch 2") as raised:
        hosts.run(key, Counter(fail=2), batch(2), [])
    assert "in the subtask host" in str(raised.value)
    with pytest.raises(SubtaskHostError, match="KeyError"):
        hosts.run(key, Counter(fail=2), batch(102), [])
    third = hosts.run(key, Counter(fail=2), batch(3), [])
    assert host_pid(third) == host_pid(first) and third.outcome == "2"
    os.kill(host_pid(third), signal.SIGKILL)


def test_a_host_killed_mid_batch_fails_the_task_and_the_next_batch_starts_another(
    key: CacheKey,
) -> None:
    hosts = SubtaskHosts(idle_s=30)
    first = hosts.run(key, Counter(die=2), batch(1), [])
    with pytest.raises(SubtaskHostLostError, match="ended before it finished micro-batch 2"):
        hosts.run(key, Counter(die=2), batch(2), [])
    wait_gone(hosts, host_pid(first), "the killed host to end")
    again = hosts.run(key, Counter(die=2), batch(3), [])
    assert host_pid(again) != host_pid(first)
    assert again.outcome == "1"  # a new process: it rebuilds (here: counts from zero)
    os.kill(host_pid(again), signal.SIGKILL)


def test_a_host_ends_with_its_executor_and_when_idle(key: CacheKey) -> None:
    executor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    hosts = SubtaskHosts(idle_s=300, watch_pid=executor.pid)
    try:
        done = hosts.run(key, Counter(), batch(1), [])
        executor.kill()
        executor.wait()
        wait_gone(hosts, host_pid(done), "the host to end with its executor")
    finally:
        executor.kill()
    address = host_address(key, "exec-1")
    assert not address.exists() and not address.with_suffix(".lock").exists()
    idle_hosts = SubtaskHosts(idle_s=0.2)
    idle = idle_hosts.run(key, Counter(), batch(1), [])
    wait_gone(idle_hosts, host_pid(idle), "the idle host to end")
    assert not address.exists()


def test_a_second_host_for_the_same_address_gives_way(key: CacheKey) -> None:
    done = SubtaskHosts(idle_s=30).run(key, Counter(), batch(1), [])
    address = host_address(key, "exec-1")
    second = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from spark_ckpt.spark.executors.subtask_host import main; "
            "sys.exit(main(sys.argv[1:]))",
            str(address),
            str(os.getpid()),
            "30",
        ],
        timeout=120,
        check=False,
    )
    assert second.returncode == 0  # it returned at once: the first host holds the lock
    assert SubtaskHosts().run(key, Counter(), batch(2), []).outcome == "2"
    os.kill(host_pid(done), signal.SIGKILL)


def test_the_files_of_killed_hosts_are_swept(key: CacheKey) -> None:
    hosts = SubtaskHosts(idle_s=30)
    done = hosts.run(key, Counter(), batch(1), [])
    address = host_address(key, "exec-1")
    _sweep(address.parent, older_s=0)
    assert address.exists()  # a live host holds its lock
    os.kill(host_pid(done), signal.SIGKILL)
    wait_gone(hosts, host_pid(done), "the host to die")
    _sweep(address.parent, older_s=0)
    assert not address.exists() and not address.with_suffix(".lock").exists()


def test_a_host_ends_when_its_run_is_over(key: CacheKey, tmp_path: Path) -> None:
    hosts = SubtaskHosts(idle_s=300, run_check_s=0.5)  # the run's end, not idleness, ends it
    over, closed = tmp_path / "over", tmp_path / "closed"
    runner = Counter(ended=str(over), closed=str(closed))
    hosts.run(key, runner, batch(1), [])
    done = hosts.run(key, runner, batch(2), [])
    assert process_exists(host_pid(done)) and not closed.exists()
    over.touch()  # the driver recorded the run's end
    wait_gone(hosts, host_pid(done), "the host of an ended run to end")
    assert not host_address(key, "exec-1").exists()
    assert closed.read_text().split() == ["1", "2"]  # the runner was closed, after its batches


def test_the_socket_directory_is_private(monkeypatch: pytest.MonkeyPatch) -> None:
    short = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))  # short enough for sockets
    monkeypatch.setattr(tempfile, "tempdir", str(short))
    mine = short / f"spark-ckpt-{os.getuid()}"
    mine.mkdir(mode=0o755)
    os.chmod(mine, 0o755)
    hosts = host_directory()
    assert hosts.parent == mine
    assert stat.S_IMODE(mine.stat().st_mode) == stat.S_IMODE(hosts.stat().st_mode) == 0o700
    if os.getuid() == 0:  # another user's directory is refused
        os.chown(mine, 12345, -1)
        with pytest.raises(EnvironmentSetupError, match="must be a directory of user"):
            host_directory()


def test_a_temporary_directory_too_long_for_sockets_falls_back_to_tmp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    deep = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp")) / ("d" * 90)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    hosts = host_directory()
    assert hosts == Path("/tmp") / f"spark-ckpt-{os.getuid()}" / "hosts"
    address = host_address(CacheKey("/root", "run", 0), "exec")
    assert len(os.fsencode(address)) <= 107
