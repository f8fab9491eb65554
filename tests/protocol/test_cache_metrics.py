"""Cache metrics of subtasks on the executors: carried by acknowledgements into a completed
checkpoint's statistics, absent (and the metadata unchanged) for subtasks in the driver."""

from __future__ import annotations

import json

from spark_ckpt.protocol.checkpoint import CheckpointStats
from spark_ckpt.protocol.state_handles import (
    AcknowledgeCheckpoint,
    CacheMetrics,
    CheckpointMetrics,
    TaskId,
    TaskStateHandle,
)


def test_metrics_add_up_per_lookup() -> None:
    m = CacheMetrics().add(hit=False, ms=40).add(hit=True, ms=2).add(hit=True, ms=3)
    assert m == CacheMetrics(hits=2, hit_ms=5, rebuilds=1, rebuild_ms=40)


def test_an_acknowledgement_carries_them_and_older_ones_decode() -> None:
    task = TaskId("chain", 1)
    ack = AcknowledgeCheckpoint(3, task, TaskStateHandle(task), cache=CacheMetrics(hits=4))
    again = AcknowledgeCheckpoint.from_dict(json.loads(json.dumps(ack.to_dict())))
    assert again == ack
    plain = AcknowledgeCheckpoint(3, task, TaskStateHandle(task), CheckpointMetrics(sync_ms=1))
    assert "cache" not in plain.to_dict()
    assert AcknowledgeCheckpoint.from_dict(plain.to_dict()).cache is None


def test_statistics_keep_them_only_when_there_are_any() -> None:
    stats = CheckpointStats(1, 2, task_cache={"chain#0": CacheMetrics(rebuilds=1, rebuild_ms=9)})
    assert CheckpointStats.from_dict(json.loads(json.dumps(stats.to_dict()))) == stats
    driver = CheckpointStats(1, 2)
    assert "task_cache" not in driver.to_dict()  # the metadata of 0.2 runs, unchanged
    assert CheckpointStats.from_dict(driver.to_dict()).task_cache == {}
