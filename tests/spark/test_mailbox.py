"""The mailbox between Spark's processes: malformed files are set aside (never returned
again, never raising), requests expire, run boxes are separate."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_ckpt.coordination.mailbox import REJECTED_DIR, Mailbox
from spark_ckpt.coordination.messages import Request, RequestKind


def test_malformed_files_are_set_aside_and_good_ones_delivered(tmp_path: Path) -> None:
    box = Mailbox(str(tmp_path))
    good = box.post(Request("r1", RequestKind.CHECKPOINT))
    directory = tmp_path / "_mailbox"
    bad = {
        "00-not-json.json": "{oops",
        "01-list.json": "[1, 2]",
        "02-unknown.json": '{"type": "hello"}',
        "03-fields.json": '{"type": "request", "kind": "checkpoint"}',
        "04-kind.json": '{"type": "request", "request_id": "x", "kind": "reboot"}',
        "05-binary.json": "\udcff",
    }
    for name, text in bad.items():
        (directory / name).write_bytes(text.encode("utf-8", "surrogateescape"))
    received = box.receive()
    assert [name for name, _ in received] == [good]
    assert received[0][1] == Request("r1", RequestKind.CHECKPOINT)
    assert box.rejected() == sorted(bad)
    assert sorted(p.name for p in (directory / REJECTED_DIR).iterdir()) == sorted(bad)
    assert box.receive() == received  # nothing malformed is seen twice


@pytest.mark.parametrize(
    ("expires", "now", "expired"), [(None, 10**15, False), (100, 100, False), (100, 101, True)]
)
def test_requests_expire_and_round_trip(expires: int | None, now: int, expired: bool) -> None:
    request = Request("r", RequestKind.STOP, None, True, expires)
    assert Request.from_dict(request.to_dict()) == request
    assert request.expired(now) is expired


def test_run_boxes_are_separate_from_the_shared_box(tmp_path: Path) -> None:
    shared, run_a, run_b = (
        Mailbox(str(tmp_path)),
        Mailbox(str(tmp_path), "a"),
        Mailbox(str(tmp_path), "b"),
    )
    run_a.post(Request("for-a", RequestKind.CHECKPOINT))
    shared.post(Request("for-all", RequestKind.CHECKPOINT))
    assert [m.request_id for _, m in run_a.receive()] == ["for-a"]  # type: ignore[union-attr]
    assert run_b.receive() == []
    assert [m.request_id for _, m in shared.receive()] == ["for-all"]  # type: ignore[union-attr]
    run_a.remove_box()
    run_a.remove_box()  # idempotent
    assert run_a.receive() == []
