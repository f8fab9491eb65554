"""The messages every process posts to the coordinator's mailbox: acknowledgements and
declines of checkpoints (:mod:`spark_ckpt.protocol.state_handles`), and the requests of
clients (:class:`Request`), each with an explicit JSON form."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from spark_ckpt.errors import ProtocolError
from spark_ckpt.protocol.state_handles import AcknowledgeCheckpoint, DeclineCheckpoint


class RequestKind(StrEnum):
    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"
    STOP = "stop"  # take a final checkpoint (or savepoint), then let the job stop
    PAUSE = "pause"  # no periodic checkpoints until resumed (see spark_ckpt.coordination.schedule)
    RESUME = "resume"  # periodic checkpoints again


@dataclass(frozen=True)
class Request:
    """Client → coordinator: take a checkpoint or savepoint now, prepare to stop, or pause or
    resume the periodic checkpoints."""

    request_id: str
    kind: RequestKind
    target: str | None = None  # savepoint directory
    savepoint: bool = False  # for STOP: stop with a savepoint instead of a checkpoint
    #: Wall-clock time (epoch ms) after which the request must not be acted on: the client
    #: stopped waiting for it. None: never expires.
    expires_ms: int | None = None
    #: For STOP: read every channel up to where it was when the request arrived before the
    #: final checkpoint (Flink's ``stop --drain``).
    drain: bool = False

    def expired(self, now_ms: int) -> bool:
        return self.expires_ms is not None and now_ms > self.expires_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "request",
            "request_id": self.request_id,
            "kind": self.kind.value,
            "target": self.target,
            "savepoint": self.savepoint,
            "expires_ms": self.expires_ms,
            "drain": self.drain,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Request:
        expires = d.get("expires_ms")
        return Request(
            str(d["request_id"]),
            RequestKind(d["kind"]),
            d.get("target"),
            bool(d.get("savepoint", False)),
            None if expires is None else int(expires),
            bool(d.get("drain", False)),
        )


Message = AcknowledgeCheckpoint | DeclineCheckpoint | Request


def decode_message(d: dict[str, Any]) -> Message:
    try:
        kind = d["type"]
        if kind == "ack":
            return AcknowledgeCheckpoint.from_dict(d)
        if kind == "decline":
            return DeclineCheckpoint.from_dict(d)
        if kind == "request":
            return Request.from_dict(d)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ProtocolError(f"malformed message: {e!r}") from e
    raise ProtocolError(f"unknown message type {kind!r}")
