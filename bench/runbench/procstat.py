"""What the machine and the benchmark's processes did during a measurement, read from
``/proc`` (Linux) and the JVM: the sources of variance the overhead and scaling benches
report next to every repetition.

* :class:`CpuSample` — CPU time of the benchmark's process tree (this driver, Spark's JVM,
  its Python workers and source runners: every descendant of this process) and of the whole
  machine; the difference between two samples gives the cores the benchmark used and the
  cores **other work** on the machine took meanwhile (:func:`cpu_between`).
* :class:`PyGcTimer` — collections of this (driver) process's Python GC and their time.
* :func:`jvm_gc_ms` — the JVM's cumulative garbage-collection time (classic Spark only).
* :class:`RssSampler` — the peak resident set of this process and of the JVM, sampled.
* :func:`settle` — wait (bounded) until other work on the machine leaves the cores alone.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (None: gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def parent(pid: int) -> int | None:
    """The parent of *pid* (None: gone)."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[1])


def cmdline(pid: int) -> str:
    """The command line of *pid*, arguments joined by spaces (empty: gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def descendants(root: int) -> list[int]:
    """*root* and every process below it (one scan of ``/proc``)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of *pid* (all its threads; 0 when gone)."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    # after the command: state(0) ppid(1) ... utime(11) stime(12)
    return (int(fields[11]) + int(fields[12])) / _TICK


def machine_busy_s() -> float:
    """CPU seconds all cores spent busy since boot (``/proc/stat``: everything but idle and
    iowait)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    guest = sum(values[8:10]) if len(values) > 9 else 0  # already counted in user/nice
    return (sum(values) - idle - guest) / _TICK


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds at one instant: per process of the benchmark's tree, and the machine's."""

    at: float  # time.monotonic()
    machine_busy_s: float
    processes: dict[int, float]

    @staticmethod
    def take(root: int | None = None) -> CpuSample:
        pids = descendants(os.getpid() if root is None else root)
        return CpuSample(time.monotonic(), machine_busy_s(), {p: process_cpu_s(p) for p in pids})


def cpu_between(a: CpuSample, b: CpuSample) -> dict[str, float]:
    """Cores used between two samples: ``ours`` (the benchmark's process tree: processes
    present in *b*, counted from *a* or from their start), ``machine`` (all of it) and
    ``other`` (the rest: other work on the machine, the noise the benchmark cannot remove)."""
    wall = max(b.at - a.at, 1e-9)
    ours = sum(cpu - a.processes.get(pid, 0.0) for pid, cpu in b.processes.items())
    machine = b.machine_busy_s - a.machine_busy_s
    return {
        "wall_s": wall,
        "ours_cores": ours / wall,
        "machine_cores": machine / wall,
        "other_cores": max(machine - ours, 0.0) / wall,
    }


@dataclass
class PyGcTimer:
    """Counts this process's Python garbage collections and their wall time (``gc.callbacks``);
    :meth:`install` once, read :attr:`collections`/:attr:`seconds` before and after."""

    collections: int = 0
    seconds: float = 0.0
    _started: float = field(default=0.0, repr=False)

    def install(self) -> PyGcTimer:
        gc.callbacks.append(self._callback)
        return self

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.collections += 1
            self.seconds += time.perf_counter() - self._started


def jvm(spark: Any) -> Any | None:
    """The py4j view of Spark's JVM (None under Spark Connect)."""
    return getattr(spark, "_jvm", None)


def jvm_gc_ms(spark: Any) -> float | None:
    """The JVM's cumulative garbage-collection time in ms, over all collectors (None when the
    JVM is not reachable)."""
    view = jvm(spark)
    if view is None:
        return None
    beans = view.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    return float(sum(max(int(b.getCollectionTime()), 0) for b in beans))


def jvm_collect(spark: Any) -> None:
    """Ask the JVM for a full collection (between measurements, not inside one)."""
    view = jvm(spark)
    if view is not None:
        view.java.lang.System.gc()


def jvm_pid() -> int | None:
    """The pid of Spark's JVM started by this process (classic Spark), if any."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    return None if proc is None else int(proc.pid)


def rss_mb(pid: int, key: str = "VmRSS") -> float | None:
    """``/proc/<pid>/status`` *key* (``VmRSS``: now, ``VmHWM``: the peak) in MB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class RssSampler:
    """Samples the resident set of this process (the driver) and of the JVM every
    *interval_s* on a daemon thread; :meth:`window` starts a fresh peak."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.jvm_pid = jvm_pid()
        self._lock = threading.Lock()
        self._peak = {"driver": 0.0, "jvm": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        now = {"driver": rss_mb(os.getpid()) or 0.0}
        if self.jvm_pid is not None:
            now["jvm"] = rss_mb(self.jvm_pid) or 0.0
        with self._lock:
            for k, v in now.items():
                self._peak[k] = max(self._peak.get(k, 0.0), v)

    def window(self) -> dict[str, float]:
        """Start a new window; returns the RSS now (MB)."""
        with self._lock:
            self._peak = {"driver": 0.0, "jvm": 0.0}
        self._sample()
        with self._lock:
            return dict(self._peak)

    def peak(self) -> dict[str, float]:
        """The peak RSS (MB) since :meth:`window`."""
        self._sample()
        with self._lock:
            return dict(self._peak)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def settle(max_other_cores: float, timeout_s: float, probe_s: float = 2.0) -> dict[str, float]:
    """Wait until other work on the machine uses at most *max_other_cores* over *probe_s*,
    for at most *timeout_s* (a measurement then starts anyway). Returns the last probe and
    the wait, for the record."""
    started = time.monotonic()
    while True:
        a = CpuSample.take()
        time.sleep(probe_s)
        cpu = cpu_between(a, CpuSample.take())
        waited = time.monotonic() - started
        if cpu["other_cores"] <= max_other_cores or waited >= timeout_s:
            return {"other_cores": cpu["other_cores"], "waited_s": waited}


#: How :func:`cpu_by_kind` names a process: the first of these substrings its command line
#: holds (checked in order), else ``"other"``.
PROCESS_KINDS: tuple[tuple[str, str], ...] = (
    ("java", "jvm"),
    ("subtask_host", "subtask hosts"),
    ("python_streaming_source_runner", "source runner"),
    ("pyspark.daemon", "python workers"),
    ("pyspark.worker", "python workers"),
    ("pyspark/daemon", "python workers"),
    ("pyspark/worker", "python workers"),
)


def process_kind(command: str) -> str:
    """The kind of a process of the benchmark's tree, from its command line."""
    for needle, kind in PROCESS_KINDS:
        if needle in command:
            return kind
    return "other"


@dataclass(frozen=True)
class KindSample:
    """CPU seconds of the benchmark's tree at one instant, per process, with each process's
    kind (:func:`process_kind`; the benchmark's own process is ``"bench"``)."""

    processes: dict[int, tuple[str, float]]

    @staticmethod
    def take() -> KindSample:
        me = os.getpid()
        out: dict[int, tuple[str, float]] = {}
        for pid in descendants(me):
            kind = "bench" if pid == me else process_kind(cmdline(pid))
            out[pid] = (kind, process_cpu_s(pid))
        return KindSample(out)


def cpu_by_kind(a: KindSample, b: KindSample) -> dict[str, float]:
    """CPU seconds per process kind between two samples (processes present in *b*, counted
    from *a* or from their start; a process that ended in between is not counted)."""
    out: dict[str, float] = {}
    for pid, (kind, cpu) in b.processes.items():
        before = a.processes.get(pid)
        used = cpu - (before[1] if before is not None and before[0] == kind else 0.0)
        out[kind] = out.get(kind, 0.0) + used
    return {k: round(v, 3) for k, v in sorted(out.items())}
