"""Trigger.AvailableNow's final checkpoint, as the source runner waits for it: the
coordinator decides it (completes it, or expires it at its timeout), and the source runner
waits for that decision however late the coordinator's polls make it, triggers a failed one
again, and fails the query only when no decision comes at all. Drives the runner's wait
with a coordinator thread whose decisions come when the test says, without Spark."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from datasources.ckpt_source import CkptSource, CkptStreamReader
from spark_ckpt.coordination.topology import Topology, write_topology
from spark_ckpt.errors import CheckpointError
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.runtime.failure import CheckpointFailure, CheckpointFailureReason
from spark_ckpt.runtime.request_decider import CheckpointRequest, RequestStatus
from spark_ckpt.sources.stream_offset import StreamOffset
from spark_ckpt.spark.datasource import source_runner

TIMEOUT_S = 0.2


class Coordinator:
    """The part of the coordinator thread the wait uses. Each final request is decided
    *after_s* (real time) after it was made, as the next of *outcomes* says (None: never)."""

    def __init__(self, after_s: float, outcomes: list[RequestStatus | None]) -> None:
        self.after_s, self.outcomes = after_s, list(outcomes)
        self.requests: list[tuple[CheckpointRequest, float, RequestStatus | None]] = []
        self.last_completed = None

    def call(self, fn):  # type: ignore[no-untyped-def]
        return fn(self)

    def request_final_checkpoint(self) -> CheckpointRequest:
        request = CheckpointRequest(SnapshotType.CHECKPOINT, forced=False, final=True)
        request.status = RequestStatus.TRIGGERED
        request.checkpoint_id = len(self.requests) + 1
        self.requests.append((request, time.monotonic(), self.outcomes.pop(0)))
        return request

    def poll_now(self) -> list[object]:
        """The polls decide what is due; no barrier to place (the batch that emits them is
        not what this test is about)."""
        for request, made, outcome in self.requests:
            due = time.monotonic() - made >= self.after_s
            if request.status is RequestStatus.TRIGGERED and outcome is not None and due:
                request.status = outcome
                if outcome is RequestStatus.FAILED:
                    request.failure = CheckpointFailure(
                        request.checkpoint_id or 0, CheckpointFailureReason.EXPIRED
                    )
        return []

    def sync(self) -> None:
        pass


def runner_with(tmp_path: Path, coordinator: Coordinator) -> source_runner.SourceRunner:
    write_topology(str(tmp_path), Topology("counter", 1, None, "run"))
    source = CkptSource(
        {
            "pipeline": "p",
            "store": str(tmp_path),
            "rate": "0",
            "channels": "2",
            "checkpoint.interval": "1h",
            "checkpoint.timeout": f"{int(TIMEOUT_S * 1000)}ms",
        }
    )
    reader = source.streamReader(source.schema())
    assert isinstance(reader, CkptStreamReader)
    reader.runner._host = coordinator  # type: ignore[assignment]
    return reader.runner


def wait_at_target(runner: source_runner.SourceRunner) -> StreamOffset:
    at_target = StreamOffset.initial([5, 5])
    return runner._available_now(at_target, [5, 5], [5, 5])


def test_a_final_checkpoint_decided_after_its_timeout_ends_the_run(tmp_path: Path) -> None:
    # the coordinator's polls came late (a slow store, a long completion commit): the
    # checkpoint completes three timeouts after it was triggered; the run waits for it
    coordinator = Coordinator(3 * TIMEOUT_S, [RequestStatus.COMPLETED])
    wait_at_target(runner_with(tmp_path, coordinator))
    assert len(coordinator.requests) == 1


def test_an_expired_final_checkpoint_is_triggered_again(tmp_path: Path) -> None:
    coordinator = Coordinator(1.5 * TIMEOUT_S, [RequestStatus.FAILED, RequestStatus.COMPLETED])
    wait_at_target(runner_with(tmp_path, coordinator))
    assert [o for _, _, o in coordinator.requests] == [
        RequestStatus.FAILED,
        RequestStatus.COMPLETED,
    ]


def test_a_final_checkpoint_never_decided_fails_the_query(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(source_runner, "FINAL_DECISION_GRACE_S", 0.3)
    coordinator = Coordinator(0.0, [None])  # a coordinator that hangs
    with pytest.raises(CheckpointError, match="was not decided within"):
        wait_at_target(runner_with(tmp_path, coordinator))
    assert len(coordinator.requests) == 1
