"""The overhead measured inside one query (``bench/overhead.py --alternating``): windows
that alternate between checkpoints every ``interval_ms`` and none, in one running pipeline.

Why a second way. The ABBA runs of :mod:`runbench.overhead` compare two queries that run one
after the other, each with its own start, Python workers, JIT state and its share of whatever
else the machine did meanwhile, so adjacent runs of the *same* variant can differ by more than
the few percent to be told apart. Here one query runs throughout, so the two kinds of window
share everything but the checkpoints, and a pair of windows is ``2 * window_s`` seconds apart
instead of minutes.

How. The pipeline runs on the saturated path (a backlog, ``maxRowsPerTrigger``). After
``warmup_s``, windows of ``window_s`` follow each other in ABBA order (off, on, on, off,
off, on, ...), checkpoints every ``interval_ms`` during an *on* window and none during an
*off* one, switched in one of two ways (``trigger``):

* ``periodic`` (the default; :class:`PeriodicSwitch`): the pipeline is configured with
  periodic checkpoints every ``interval_ms`` (exactly-once aligned, 2 retained), the
  production path; the bench pauses them for an *off* window and resumes them for an *on*
  window through the pipeline's client (:meth:`PipelineClient.pause_checkpoints` /
  :meth:`~PipelineClient.resume_checkpoints`, one request per window, the same in both
  kinds). The checkpoints completed in a window are read from the statistics history at the
  end of every window, in both kinds of window alike. The bench does nothing else while a
  window runs;
* ``requests`` (:class:`Requester`): the pipeline runs with checkpointing off, and during an
  *on* window the bench requests a checkpoint through the client (``RequestKind.CHECKPOINT``,
  the request Flink's REST API calls *trigger a checkpoint*) every ``interval_ms``, the next
  one once the previous one completed — as the periodic trigger does with at most one
  checkpoint at a time — and none during an *off* window. Its costs beyond the periodic
  trigger's: posting each request, polling the store for its answer, and retention keeping
  a checkpoint that answers a request 5 s after its completion.

A window's first ``guard_s`` are not measured: a checkpoint triggered at the end of an *on*
window completes in the next window's guard. A window's rows/s are those of the batches that
start inside its measured part (:func:`window_between`). Reported: each pair's ratio on/off,
their median with a bootstrap 95% interval (:func:`~runbench.steady.paired_ratios`), the
checkpoints completed per *on* window, the CPU the bench's own process used in each kind of
window, and per window the CPU of the benchmark's processes by kind
(:func:`~runbench.procstat.cpu_by_kind`) and the mean of Spark's ``durationMs`` phases.

With ``requests``, the bench's own reads are the same in both kinds of window. Waiting for a
completion reads the store (:meth:`PipelineClient.answer` and :meth:`PipelineClient.failure`:
the completed checkpoints and the statistics history, a few times per request), work that a
periodic trigger inside the coordinator does not cause, and that runs on the same cores as
the pipeline. So during an *off* window the requester makes the same reads at the same pace
(:meth:`Requester.mirror`: as many polls as the last request needed, for an id that answers
nothing, then one for the last answered request) and posts nothing. What is left between the
two kinds of window is the checkpoints, the coordinator's handling of the requests, and the
posting itself (:meth:`PipelineClient.request`: a liveness check and a mailbox file), which
is not mirrored.
"""

from __future__ import annotations

import os
import resource
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from benchcommon import PIPELINE

from runbench.procstat import KindSample, cpu_by_kind
from runbench.steady import (
    ProgressLog,
    Window,
    _window,
    batch_rows,
    paired_ratios,
    progress_start_s,
)
from runbench.variants import PLACEMENTS, checkpoint_config
from spark_ckpt.coordination.messages import RequestKind
from spark_ckpt.errors import SparkCkptError
from spark_ckpt.pipeline.pipeline import Pipeline

POLL_S = 1.0


@dataclass(frozen=True)
class AlternatingSettings:
    placement: str
    interval_ms: int
    warmup_s: float  # after the first batch with data, before the first window
    window_s: float
    guard_s: float  # the first seconds of every window, not measured
    pairs: int  # windows of each kind
    trigger: str = "periodic"  # or "requests" (see the module docstring)


def window_between(batches: Sequence[dict[str, Any]], t0: float, t1: float) -> Window | None:
    """The batches that start in ``[t0, t1)`` (epoch seconds), closed by the start of the
    batch after them; None when fewer than two start there or none follows them."""
    starts = [progress_start_s(b) for b in batches]
    inside = [i for i, t in enumerate(starts) if t0 <= t < t1]
    if len(inside) < 2 or inside[-1] + 1 >= len(batches):
        return None
    return _window(batches, inside[0], inside[-1] + 1)


def mean_durations(batches: Sequence[dict[str, Any]], window: Window) -> dict[str, float]:
    """The mean of each of Spark's ``durationMs`` phases over the batches of *window*."""
    inside = [b for b in batches if window.first <= int(b["batchId"]) <= window.last]
    keys = sorted({k for b in inside for k in b.get("durationMs", {})})
    return {
        k: round(sum(float(b.get("durationMs", {}).get(k, 0)) for b in inside) / len(inside), 1)
        for k in keys
    }


def windows_order(pairs: int) -> list[bool]:
    """Which windows take checkpoints, in ABBA order: off, on, on, off, off, on, ..."""
    order: list[bool] = []
    for k in range(pairs):
        order += [False, True] if k % 2 == 0 else [True, False]
    return order


#: A request id that answers nothing (:meth:`Requester.mirror`).
NO_REQUEST = "0" * 32


class Switch(Protocol):
    """Turns the checkpoints on and off for the windows (see the module docstring)."""

    #: (epoch s of the completion, checkpoint id) of the checkpoints completed so far
    completed: list[tuple[float, int]]
    failed: int

    def switch(self, on: bool) -> None: ...

    def collect(self) -> None: ...

    def prime(self) -> None: ...

    def close(self) -> None: ...


class PeriodicSwitch:
    """``periodic``: pauses and resumes the pipeline's periodic checkpoints; reads what
    completed from the statistics history (:meth:`collect`, once per window)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self._client = pipeline.client
        self.completed: list[tuple[float, int]] = []
        self.failed = 0
        self._seen: set[int] = set()

    def switch(self, on: bool) -> None:
        (self._client.resume_checkpoints if on else self._client.pause_checkpoints)(60.0)

    def collect(self) -> None:
        for record in self._client.history():
            if record.checkpoint_id in self._seen:
                continue
            self._seen.add(record.checkpoint_id)
            if record.stats is None:
                self.failed += 1
            else:
                self.completed.append((record.stats.completed_ms / 1000, record.checkpoint_id))

    def prime(self) -> None:
        """The warm-up runs with periodic checkpoints."""

    def close(self) -> None:
        """Nothing runs in the background."""


class Requester:
    """Requests a checkpoint every *interval_s* while :attr:`on` is set, the next once the
    previous one completed (at most one at a time, as the periodic trigger); while it is
    not set, makes the same reads of the store at the same pace and posts nothing
    (:meth:`mirror`, see the module docstring)."""

    def __init__(self, pipeline: Pipeline, interval_s: float) -> None:
        self._client = pipeline.client
        self._interval_s = interval_s
        self.on = threading.Event()
        self._stop = threading.Event()
        self.completed: list[tuple[float, int]] = []  # (epoch s, checkpoint id)
        self.failed = 0
        self._polls = 1  # how many polls the last request needed
        self._answered: str | None = None  # the last request that was answered
        self._thread = threading.Thread(target=self._loop, name="bench-requester", daemon=True)
        self._thread.start()

    def switch(self, on: bool) -> None:
        (self.on.set if on else self.on.clear)()

    def collect(self) -> None:
        """The completions were recorded as they were answered."""

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self._request() if self.on.is_set() else self.mirror()
            except SparkCkptError:
                self.failed += 1
            rest = self._interval_s - (time.monotonic() - began)
            if rest > 0:
                self._stop.wait(rest)

    def _request(self) -> None:
        request_id = self._client.request(RequestKind.CHECKPOINT, timeout_s=60.0)
        self._stop.wait(0.5)  # a checkpoint takes longer: no poll before
        polls = 0
        while not self._stop.is_set():
            polls += 1
            answer = self._client.answer(request_id)
            if answer is not None:
                self.completed.append((time.time(), answer.checkpoint_id))
                self._polls, self._answered = polls, request_id
                return
            if self._client.failure(request_id) is not None:
                self.failed += 1
                return
            self._stop.wait(0.25)

    def prime(self) -> None:
        """One request, before the windows: the first *off* window has one to mirror."""
        self._request()

    def mirror(self) -> None:
        """The reads of :meth:`_request` without its request: the last request's number of
        polls, each unanswered but the last."""
        if self._answered is None:  # nothing to mirror yet (the warm-up)
            return
        self._stop.wait(0.5)
        for _ in range(self._polls - 1):
            if self._stop.is_set():
                return
            self._client.answer(NO_REQUEST)
            self._client.failure(NO_REQUEST)
            self._stop.wait(0.25)
        self._client.answer(self._answered)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_alternating(
    spark: Any,
    s: AlternatingSettings,
    source: dict[str, object],
    parallelism: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """One query, windows alternating (see the module docstring); its figures."""
    root = tempfile.mkdtemp(prefix="spark-ckpt-bench-alternating-")
    try:
        periodic = s.trigger == "periodic"
        pipeline = Pipeline(
            spark,
            PIPELINE,
            config=checkpoint_config(s.interval_ms if periodic else None),
            root=os.path.join(root, "pipeline"),
        )
        run = PLACEMENTS[s.placement](
            pipeline, source, output=os.path.join(root, "out"), parallelism=parallelism
        )
        progress = ProgressLog()
        requester: Switch = (
            PeriodicSwitch(pipeline) if periodic else Requester(pipeline, s.interval_ms / 1000)
        )
        windows: list[dict[str, Any]] = []
        try:
            while not any(batch_rows(b) for b in progress.ordered()):
                time.sleep(POLL_S)
                progress.poll(run.query)
            requester.prime()  # a checkpoint in the warm-up
            time.sleep(s.warmup_s)
            for checkpoints in windows_order(s.pairs):
                requester.switch(checkpoints)
                t0, cpu0, kinds0 = time.time(), _cpu_s(), KindSample.take()
                deadline = time.monotonic() + s.window_s
                while (left := deadline - time.monotonic()) > 0:
                    time.sleep(min(POLL_S, left))
                    progress.poll(run.query)
                requester.collect()
                windows.append(
                    {
                        "on": checkpoints,
                        "t0": t0,
                        "t1": time.time(),
                        "bench_cpu_s": _cpu_s() - cpu0,
                        "cpu_s_by_process": cpu_by_kind(kinds0, KindSample.take()),
                    }
                )
            requester.switch(False)
            time.sleep(3 * POLL_S)  # the batch closing the last window
            progress.poll(run.query)
        finally:
            requester.close()
            run.stop_quietly()
        batches = progress.ordered()
        for w in windows:
            found = window_between(batches, w["t0"] + s.guard_s, w["t1"])
            w["window"] = None if found is None else found.as_dict()
            w["rows_per_s"] = None if found is None else found.rows_per_s
            w["duration_ms"] = None if found is None else mean_durations(batches, found)
            w["checkpoints"] = sum(1 for t, _ in requester.completed if w["t0"] <= t < w["t1"])
            log(
                f"  window {'on ' if w['on'] else 'off'} "
                + (f"{w['rows_per_s']:>12,.0f} rows/s" if w["rows_per_s"] else "   (no window)")
                + f", {w['checkpoints']} checkpoints, bench CPU {w['bench_cpu_s']:.2f} s"
            )
        on = [w for w in windows if w["on"]]
        off = [w for w in windows if not w["on"]]
        # pair k: the k-th window of each kind (adjacent in ABBA order)
        pairs = [
            (a, b) for a, b in zip(on, off, strict=True) if a["rows_per_s"] and b["rows_per_s"]
        ]
        return {
            "settings": s.__dict__,
            "windows": windows,
            "ratio": paired_ratios(
                [a["rows_per_s"] for a, _ in pairs], [b["rows_per_s"] for _, b in pairs]
            ),
            "checkpoints_per_on_window": [w["checkpoints"] for w in on],
            "failed_requests": requester.failed,
            "bench_cpu_s": {
                "on": sum(w["bench_cpu_s"] for w in on),
                "off": sum(w["bench_cpu_s"] for w in off),
            },
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
