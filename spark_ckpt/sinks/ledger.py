"""Bookkeeping of the stateless ``ckpt-sink`` across micro-batches.

Executors stage each run of data rows between two barriers of a channel as one file and
report, per channel and in channel order, a list of events: a staged file, or a barrier
(checkpoint id, offset). The driver-side commit (a fresh process every micro-batch) folds
those events into a :class:`SinkLedger`:

* files staged on a channel after its last barrier are *open*; when the channel's barrier *n*
  arrives they belong to checkpoint *n*'s transaction;
* when every channel delivered barrier *n*, the sink acknowledges *n* with its transaction and
  the barrier offsets (the positions the source rewinds to on restore);
* a transaction stays in the ledger — and in every later acknowledgement — until the sink
  reports it committed (see :mod:`spark_ckpt.sinks.two_phase_commit`).

The ledger is JSON, persisted after each batch. ``apply`` is idempotent per batch id, so a
replayed batch (Spark re-runs a failed batch with the same id) changes nothing twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import ProtocolError
from spark_ckpt.protocol.barrier import (
    BARRIER_COLUMNS,
    BARRIER_OPTIONS,
    CHANNEL,
    CHECKPOINT_ID,
    KIND,
    OFFSET,
    RecordKind,
)


@dataclass(frozen=True)
class SinkEvent:
    """One event of one channel: a staged file (``file`` set) or a barrier (``checkpoint_id``
    and ``offset`` set). ``channels`` is the number of source channels (on barriers)."""

    channel: int
    file: str | None = None
    checkpoint_id: int | None = None
    offset: int | None = None
    channels: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> SinkEvent:
        return SinkEvent(
            int(d["channel"]),
            d.get("file"),
            None if d.get("checkpoint_id") is None else int(d["checkpoint_id"]),
            None if d.get("offset") is None else int(d["offset"]),
            None if d.get("channels") is None else int(d["channels"]),
        )


@dataclass
class SinkLedger:
    last_batch: int = -1
    channels: int | None = None
    open_files: dict[int, list[str]] = field(default_factory=dict)
    transactions: dict[int, list[str]] = field(default_factory=dict)
    arrivals: dict[int, dict[int, int]] = field(default_factory=dict)
    acked: list[int] = field(default_factory=list)

    def apply(self, batch_id: int, events: list[SinkEvent]) -> list[int]:
        """Fold one batch's events in; returns the checkpoints that became ready (every
        channel delivered their barrier), oldest first. A batch id not newer than the last
        applied one is ignored."""
        if batch_id <= self.last_batch:
            return []
        for e in events:
            if e.checkpoint_id is None:
                if e.file is None:
                    raise ProtocolError(f"sink event without file or barrier: {e}")
                self.open_files.setdefault(e.channel, []).append(e.file)
                continue
            if e.channels is not None:
                self.channels = e.channels
            cid = e.checkpoint_id
            if cid in self.acked:
                continue  # a late barrier of a checkpoint already acknowledged
            self.transactions.setdefault(cid, []).extend(self.open_files.pop(e.channel, []))
            self.arrivals.setdefault(cid, {})[e.channel] = int(e.offset or 0)
        self.last_batch = batch_id
        if self.channels is None:
            return []
        ready = sorted(
            c for c, a in self.arrivals.items() if len(a) >= self.channels and c not in self.acked
        )
        self.acked.extend(ready)
        return ready

    def pending_transactions(self, upto: int) -> dict[int, list[str]]:
        """Transactions of checkpoints ≤ *upto* not yet known committed."""
        return {c: f for c, f in sorted(self.transactions.items()) if c <= upto}

    def committed(self, upto: int) -> None:
        """Forget what the sink committed (checkpoints ≤ *upto*)."""
        for c in [c for c in self.transactions if c <= upto]:
            del self.transactions[c]
        for c in [c for c in self.arrivals if c <= upto]:
            del self.arrivals[c]
        self.acked = [c for c in self.acked if c > upto]

    def to_json(self) -> str:
        return json.dumps(
            {
                "last_batch": self.last_batch,
                "channels": self.channels,
                "open_files": {str(k): v for k, v in self.open_files.items()},
                "transactions": {str(k): v for k, v in self.transactions.items()},
                "arrivals": {
                    str(k): {str(c): o for c, o in v.items()} for k, v in self.arrivals.items()
                },
                "acked": self.acked,
            },
            sort_keys=True,
        )

    @staticmethod
    def from_json(text: str) -> SinkLedger:
        try:
            return SinkLedger.from_dict(json.loads(text))
        except ValueError as e:
            raise ProtocolError(f"corrupt ckpt-sink ledger: {e}") from e

    @staticmethod
    def from_dict(d: Any) -> SinkLedger:
        """The ledger of a decoded :meth:`to_json`; :class:`ProtocolError` if it is not one."""
        try:
            return SinkLedger(
                last_batch=int(d["last_batch"]),
                channels=None if d.get("channels") is None else int(d["channels"]),
                open_files={int(k): list(v) for k, v in d["open_files"].items()},
                transactions={int(k): list(v) for k, v in d["transactions"].items()},
                arrivals={
                    int(k): {int(c): int(o) for c, o in v.items()} for k, v in d["arrivals"].items()
                },
                acked=[int(c) for c in d["acked"]],
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ProtocolError(f"corrupt ckpt-sink ledger: {e}") from e


def split_at_barriers(table: pa.Table, stage: Callable[[pa.Table], str]) -> list[SinkEvent]:
    """Executor side: cut *table* (``ckpt-source`` rows of any channels, channel order kept)
    into runs of data rows between barriers; stage each run with *stage* (it receives the
    user columns and returns the staged file's JSON) and report the events per channel, in
    order. Cancel markers and progress rows are ignored. One filter per channel; no loop over
    data rows."""
    events: list[SinkEvent] = []
    if table.num_rows == 0:
        return events
    user_columns = [n for n in table.column_names if n not in BARRIER_COLUMNS]
    for ch in sorted(pc.unique(table.column(CHANNEL)).to_pylist()):
        rows = table.filter(pc.equal(table.column(CHANNEL), ch))
        control = pc.indices_nonzero(pc.not_equal(rows.column(KIND), RecordKind.DATA.code))
        cursor = 0
        for i in control.to_pylist():
            if i > cursor:
                events.append(
                    SinkEvent(ch, file=stage(rows.slice(cursor, i - cursor).select(user_columns)))
                )
            row = rows.slice(i, 1).to_pylist()[0]
            cursor = i + 1
            if row[KIND] != RecordKind.BARRIER.code:
                continue
            options = json.loads(row[BARRIER_OPTIONS] or "{}")
            events.append(
                SinkEvent(
                    ch,
                    checkpoint_id=int(row[CHECKPOINT_ID]),
                    offset=int(row[OFFSET]),
                    channels=options.get("channels"),
                )
            )
        if cursor < rows.num_rows:
            events.append(SinkEvent(ch, file=stage(rows.slice(cursor).select(user_columns))))
    return events
