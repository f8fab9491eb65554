"""A stop whose final checkpoint fails (Flink: a failed stop-with-savepoint): the client is
told at once, and the pipeline goes on with periodic checkpoints; the final checkpoint of a
restart for new channels is taken again. The coordinator's host on a real Delta store, driven
poll by poll (no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest
from coordinator_hosts import SUBTASKS, started_host

from spark_ckpt.client.pipeline_client import PipelineClient
from spark_ckpt.coordination.mailbox import Mailbox
from spark_ckpt.coordination.messages import Request, RequestKind
from spark_ckpt.coordination.requests import RESTART
from spark_ckpt.errors import CheckpointFailedError
from spark_ckpt.protocol.state_handles import (
    DeclineCheckpoint,
)
from spark_ckpt.runtime.checkpoint_cleaner import REQUEST_ID


def test_a_failed_stop_fails_its_client_and_the_pipeline_goes_on(tmp_path: Path) -> None:
    root = str(tmp_path)
    host, clock, run_id = started_host(root)
    Mailbox(root).post(Request("stop-1", RequestKind.STOP))
    [final] = host.poll(tick=False)
    assert final.final and host.stopping is not None
    clock.advance(1_000)
    assert host.poll() == []  # no periodic checkpoint while stopping
    decline = DeclineCheckpoint(final.checkpoint_id, SUBTASKS[0], "writing state failed: disk")
    Mailbox(root, run_id).post(decline)
    assert host.poll(tick=False) == []
    assert host.stopping is None  # the source reads on
    clock.advance(60)
    [periodic] = host.poll()  # periodic checkpoints again
    assert periodic.checkpoint_id > final.checkpoint_id and not periodic.final
    client = PipelineClient(root)
    failure = client.failure("stop-1")
    assert failure is not None and failure.checkpoint_id == final.checkpoint_id
    assert failure.properties[REQUEST_ID] == "stop-1"
    with pytest.raises(CheckpointFailedError, match="writing state failed: disk"):
        client.wait_for("stop-1", timeout_s=60)
    assert client.failure("stop-2") is None


def test_the_final_checkpoint_of_a_restart_is_taken_again(tmp_path: Path) -> None:
    root = str(tmp_path)
    host, _, run_id = started_host(root)
    assert host.request_restart("new partitions [t-3]")
    [first] = host.poll(tick=False)
    Mailbox(root, run_id).post(DeclineCheckpoint(first.checkpoint_id, SUBTASKS[1], "lost"))
    [again] = host.poll(tick=False)
    assert again.final and again.checkpoint_id > first.checkpoint_id
    stopping = host.stopping
    assert stopping is not None and stopping.checkpoint_id == again.checkpoint_id
    assert stopping.properties[RESTART] == "new partitions [t-3]"


def test_a_stop_on_the_users_behalf_asks_again_then_stops_without_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``duration_s`` or Ctrl-C: a final checkpoint that keeps failing is asked for
    :data:`STOP_ATTEMPTS` times, then the query stops without one, quietly."""
    from types import SimpleNamespace

    from spark_ckpt.coordination.runs import RunState
    from spark_ckpt.pipeline import pipeline_run

    asked: list[int] = []
    ended: list[object] = []

    def failing_stop(self: object) -> None:
        asked.append(1)
        raise CheckpointFailedError("the stop request failed: checkpoint 9 declined: disk")

    monkeypatch.setattr(pipeline_run.PipelineRun, "stop", failing_stop)
    monkeypatch.setattr(pipeline_run, "end_query", ended.append)
    reports: list[RunState] = []
    run = pipeline_run.PipelineRun(
        pipeline=SimpleNamespace(client=SimpleNamespace(latest=lambda: "latest")),  # type: ignore[arg-type]
        run_id="r",
        attempt=1,
        query="the query",  # type: ignore[arg-type]
        function=None,  # type: ignore[arg-type]
        files=None,  # type: ignore[arg-type]
    )
    monkeypatch.setattr(run, "retire", lambda: None)
    monkeypatch.setattr(run, "report", lambda state, **_: reports.append(state))
    monkeypatch.setattr(pipeline_run.PipelineRun, "restored_from", None)
    assert run.stop_quietly() == "latest"
    assert len(asked) == pipeline_run.STOP_ATTEMPTS
    assert ended == ["the query"] and reports == [RunState.STOPPED]
