"""The rules a restore keeps, on checkpoint metadata alone (no Spark, no store)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from spark_ckpt.errors import ConfigError, RestoreError
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.state_handles import (
    BlobKind,
    BlobRef,
    SourceOffset,
    TaskId,
    TaskStateHandle,
)
from spark_ckpt.runtime.restore_settings import (
    OUTPUT_AS_OF,
    PipelineShape,
    RestoreKind,
    RestoreSettings,
    check_restorable,
    output_checkpoint,
    parse_time,
    without_uids,
)


def ref(uid: str, kind: BlobKind = BlobKind.KEYED_FULL) -> BlobRef:
    return BlobRef(9, uid, 0, kind, "s", 0, 127, -1, 0, 1, 10, "c")


def checkpoint(
    uids: tuple[str, ...], channels: int = 2, savepoint: bool = False, owner: str | None = None
) -> CompletedCheckpoint:
    offsets = tuple(SourceOffset("source", c, 5) for c in range(channels))
    task = TaskStateHandle(TaskId("counter", 0), tuple(ref(u) for u in uids), offsets)
    kind = SnapshotType.SAVEPOINT if savepoint else SnapshotType.CHECKPOINT
    props = {} if owner is None else {"pipeline": owner}
    return CompletedCheckpoint(9, kind, (task,), CheckpointStats(0, 1), props)


SHAPE = PipelineShape("p", ("counter",), {"source": 2}, 128)


def test_state_of_every_claimed_uid_restores_and_a_new_operator_starts_empty() -> None:
    shape = PipelineShape("p", ("counter", "fresh"), {"source": 2}, 128)
    cp = checkpoint(("counter", "_task:counter"))
    assert check_restorable(cp, shape, RestoreSettings.latest()) == []


def test_unclaimed_state_is_refused_naming_the_uid_unless_allowed() -> None:
    cp = checkpoint(("counter", "old-op"))
    with pytest.raises(RestoreError, match="'old-op'"):
        check_restorable(cp, SHAPE, RestoreSettings.latest())
    allowed = RestoreSettings.latest(allow_non_restored_state=True)
    assert check_restorable(cp, SHAPE, allowed) == ["old-op"]
    assert {b.operator_uid for b in without_uids(cp, ["old-op"]).blobs()} == {"counter"}


def test_a_changed_channel_count_is_refused() -> None:
    with pytest.raises(RestoreError, match=r"had 3 channels.*now has 2"):
        check_restorable(checkpoint(("counter",), channels=3), SHAPE, RestoreSettings.latest())


def test_a_changed_max_parallelism_is_refused_a_changed_parallelism_is_not() -> None:
    cp = checkpoint(("counter",))
    with pytest.raises(RestoreError, match=r"max parallelism 64.*now has 128"):
        check_restorable(
            cp, SHAPE, RestoreSettings.latest(), stored_max_parallelism=[("counter", 64)]
        )
    check_restorable(cp, SHAPE, RestoreSettings.latest(), stored_max_parallelism=[("counter", 128)])


def test_a_savepoint_of_another_pipeline_is_refused_unless_forced() -> None:
    cp = checkpoint(("counter",), savepoint=True, owner="q")
    with pytest.raises(RestoreError, match="belongs to pipeline 'q'"):
        check_restorable(cp, SHAPE, RestoreSettings.savepoint("/sp"))
    check_restorable(cp, SHAPE, RestoreSettings.savepoint("/sp", force=True))


def test_settings_validate_their_arguments() -> None:
    with pytest.raises(ConfigError):
        RestoreSettings.checkpoint(0)
    with pytest.raises(ConfigError):
        RestoreSettings.savepoint("")
    naive = RestoreSettings.as_of(datetime(2026, 1, 1))
    assert naive.kind is RestoreKind.AS_OF and naive.time == datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-23T10:00:00", datetime(2026, 11, 23, 10, tzinfo=UTC)),
        ("2026-11-23T10:00:00Z", datetime(2026, 11, 23, 10, tzinfo=UTC)),
        ("2026-11-23T11:00:00+01:00", datetime(2026, 11, 23, 10, tzinfo=UTC)),
        ("0", datetime(1970, 1, 1, tzinfo=UTC)),
    ],
)
def test_times_parse(text: str, expected: datetime) -> None:
    assert parse_time(text) == expected


def test_a_bad_time_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="ISO-8601"):
        parse_time("yesterday")


def test_a_restored_checkpoint_stands_for_its_source_in_the_sink() -> None:
    cp = checkpoint(("counter",))
    assert output_checkpoint(cp) == 9
    from dataclasses import replace

    assert output_checkpoint(replace(cp, properties={OUTPUT_AS_OF: "4"})) == 4
