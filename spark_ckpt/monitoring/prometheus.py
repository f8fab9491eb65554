"""``/metrics``: a pipeline's checkpoint figures in Prometheus' text exposition format
(version 0.0.4), under Flink's metric names where Flink has one, prefixed ``spark_ckpt_``
(Flink's Prometheus reporter prefixes ``flink_jobmanager_job_``).

Every sample carries the labels ``pipeline`` and ``run`` (the live run, else the newest;
``""`` before the first); per-subtask and per-channel figures add ``subtask`` or
``channel``. Durations are milliseconds, sizes bytes, timestamps epoch milliseconds (Flink's
units for the checkpoint metrics). All are gauges: the counts are over the statistics
history (the newest ``checkpoint.history`` records), as ``client.stats()`` counts them, and
a gauge Flink reports as -1 when there is nothing to report is -1 here too.

Pure: a function of a :class:`~spark_ckpt.monitoring.root_view.RootView`, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from spark_ckpt.monitoring import documents
from spark_ckpt.monitoring.root_view import RootView
from spark_ckpt.protocol.checkpoint import CheckpointStats

PREFIX = "spark_ckpt_"
#: The content type of the text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Sample = tuple[Mapping[str, str], float]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Exposition:
    def __init__(self, labels: Mapping[str, str]) -> None:
        self.labels = dict(labels)
        self.lines: list[str] = []

    def gauge(self, name: str, help_text: str, samples: Sequence[Sample] | float) -> None:
        if not isinstance(samples, Sequence):
            samples = [({}, float(samples))]
        self.lines.append(f"# HELP {PREFIX}{name} {help_text}")
        self.lines.append(f"# TYPE {PREFIX}{name} gauge")
        for extra, value in samples:
            labels = {**self.labels, **extra}
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            self.lines.append(f"{PREFIX}{name}{{{text}}} {_number(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


#: The gauges of the newest completed checkpoint: name, help, its value (Flink's -1: none).
_LAST: tuple[tuple[str, str, Callable[[CheckpointStats], float]], ...] = (
    (
        "lastCheckpointDuration",
        "end-to-end duration of the newest completed checkpoint, ms",
        lambda s: s.end_to_end_ms,
    ),
    (
        "lastCheckpointSize",
        "bytes the newest completed checkpoint wrote (its checkpointed size)",
        lambda s: s.bytes_written,
    ),
    (
        "lastCheckpointFullSize",
        "full state size of the newest completed checkpoint, bytes",
        lambda s: s.state_bytes,
    ),
    (
        "lastCheckpointCompletionTimestamp",
        "when the newest completed checkpoint completed, epoch ms",
        lambda s: s.completed_ms,
    ),
    (
        "lastCheckpointAlignmentTime",
        "longest barrier alignment of a subtask in the newest completed checkpoint, ms",
        lambda s: s.max_alignment_ms,
    ),
)
#: The counts over the history: name, help, key of :func:`documents.counts`.
_COUNTS = (
    (
        "numberOfCompletedCheckpoints",
        "completed checkpoints and savepoints in the statistics history",
        "completed",
    ),
    (
        "numberOfFailedCheckpoints",
        "failed and aborted checkpoints in the statistics history",
        "failed",
    ),
    (
        "numberOfAbortedCheckpoints",
        "of the failed ones, those whose reason does not count as a failure",
        "aborted",
    ),
    ("numberOfInProgressCheckpoints", "checkpoints triggered and not finished", "in_progress"),
    ("totalNumberOfCheckpoints", "completed, failed and in-progress checkpoints", "total"),
)


def exposition(view: RootView) -> str:
    """The metrics of *view* as Prometheus text (see the module docstring)."""
    current = view.current_run
    run = current.status.run_id if current is not None else ""
    out = _Exposition({"pipeline": view.pipeline, "run": run})
    n = documents.counts(view)
    last = next((r for r in reversed(view.records) if r.stats is not None), None)
    stats = last.stats if last is not None else None
    restored = documents.restored(view)

    out.gauge(
        "up",
        "1 while a run of the pipeline is live (starting or running), else 0",
        int(view.running),
    )
    for name, text, key in _COUNTS:
        out.gauge(name, text, n[key])
    out.gauge(
        "lastCompletedCheckpointId",
        "id of the newest completed checkpoint in the history (-1: none)",
        -1 if last is None else last.checkpoint_id,
    )
    for name, text, value in _LAST:
        out.gauge(name, f"{text} (-1: none)", -1 if stats is None else value(stats))
    out.gauge(
        "lastCheckpointRestoreTimestamp",
        "when the newest run that restored from a checkpoint chose it, epoch ms (-1: none)",
        -1 if restored is None else restored["restore_timestamp"],
    )
    subtasks = [] if stats is None else sorted(stats.task_metrics.items())
    out.gauge(
        "checkpointAlignmentTime",
        "barrier alignment of each subtask in the newest completed checkpoint, ms",
        [({"subtask": t}, m.alignment_ms) for t, m in subtasks],
    )
    out.gauge(
        "checkpointStartDelay",
        "start delay of each subtask in the newest completed checkpoint, ms",
        [({"subtask": t}, m.start_delay_ms) for t, m in subtasks],
    )
    out.gauge(
        "numRestarts",
        "runs of the recorded ones (the newest 20 ended, and the live one) that were restarts",
        sum(1 for r in view.runs if r.status.attempt > 1),
    )
    channels = [(report.run_id, c) for report in view.live for c in report.channels]
    out.gauge(
        "numRecordsIn",
        "input each source channel read in the live run (rows; Kafka: offsets)",
        [({"run": r, "channel": str(c.channel)}, c.read) for r, c in channels],
    )
    out.gauge(
        "pendingRecords",
        "input of each source channel not read yet (rows; Kafka: offsets)",
        [({"run": r, "channel": str(c.channel)}, c.pending) for r, c in channels],
    )
    return out.text()
