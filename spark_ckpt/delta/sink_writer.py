"""The writer of the Delta sink (Flink's ``SinkWriter``): stages a task's output as Parquet
part files under the table root and seals them into transactions at barriers.

Runs where the tasks run — an executor (``ckpt-sink``'s ``write``), the foreachBatch
process, a test — and never loads the Delta table or touches its log: staged files stay
invisible to readers until the :mod:`committer <spark_ckpt.delta.sink_committer>` adds them.
"""

from __future__ import annotations

import threading

import pyarrow as pa

from spark_ckpt.delta.boundary import delta_boundary
from spark_ckpt.delta.output_schema import delta_fields, output_table
from spark_ckpt.delta.part_file import PartFile, part_file_name
from spark_ckpt.delta.sink_target import DeltaSinkTarget
from spark_ckpt.delta.staged_file import StagedFile
from spark_ckpt.errors import StoreError
from spark_ckpt.sinks.two_phase_commit import Transaction

#: Default Arrow bytes written into one in-progress file per (operator, subtask) after which
#: it rolls before the transaction is sealed.
DEFAULT_TARGET_FILE_BYTES = 64 << 20


class DeltaSinkWriter:
    """The :class:`~spark_ckpt.sinks.two_phase_commit.SinkWriter` of a Delta sink writing to
    *target*.

    Output is encoded as it arrives into an in-progress Parquet file per (operator, subtask)
    (:class:`~spark_ckpt.delta.part_file.PartFile`: zstd, timestamps as UTC microseconds,
    barrier columns dropped, one row group per write). The file rolls — is closed into the
    subtask's open transaction — once the Arrow data written into it exceeds
    *target_file_bytes*, when the schema changes, and at :meth:`pre_commit`, which seals the
    open transaction into a :class:`~spark_ckpt.sinks.two_phase_commit.Transaction` whose payload is
    the tuple of :meth:`StagedFile.to_json <spark_ckpt.delta.staged_file.StagedFile.to_json>`
    strings.

    Threading: each (operator, subtask) is written by one thread at a time; the open
    transactions of different subtasks are guarded by a lock. Errors of Arrow and the file
    system raise :class:`StoreError`; output that Delta cannot hold raises
    :class:`~spark_ckpt.errors.ProtocolError`."""

    def __init__(
        self, target: DeltaSinkTarget, *, target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES
    ) -> None:
        self.target = target
        self.target_file_bytes = target_file_bytes
        self._root_ready = False
        self._lock = threading.Lock()
        self._open: dict[tuple[str, int], list[StagedFile]] = {}  # rolled, not yet sealed
        self._parts: dict[tuple[str, int], PartFile] = {}  # in progress

    def stage(self, table: pa.Table, *, subtask: int) -> StagedFile:
        """Write *table* (barrier columns dropped, types coerced by
        :func:`~spark_ckpt.delta.output_schema.output_table`) as one new Parquet file under
        the table root and describe it, outside any transaction (``ckpt-sink`` tracks staged
        files itself). Does not touch the Delta log or load the table; the file stays
        invisible until committed."""
        out = output_table(table)
        part = self._open_part(out.schema, subtask)
        part.write(out)
        return part.close()

    def _open_part(self, schema: pa.Schema, subtask: int) -> PartFile:
        delta_fields(schema)  # unsupported types fail here, not at commit
        name = part_file_name(subtask, self.target.tag)
        with delta_boundary(f"staging {name}", StoreError):
            if not self._root_ready and self.target.root:
                self.target.base_fs.create_dir(self.target.root, recursive=True)
                self._root_ready = True
            return PartFile(self.target.fs, name, schema)

    def write(self, operator_uid: str, subtask: int, table: pa.Table) -> None:
        """Add *table* to the open transaction of (*operator_uid*, *subtask*): encode it into
        the subtask's in-progress Parquet file (one row group per call), as Flink's file
        sink encodes records as they arrive. The file rolls — is closed and joins the open
        transaction — once it holds ``target_file_bytes`` of Arrow data or the schema
        changes, and at :meth:`pre_commit`."""
        if table.num_rows == 0:
            return
        key = (operator_uid, subtask)
        out = output_table(table)
        with self._lock:
            part = self._parts.get(key)
        if part is not None and not part.schema.equals(out.schema):
            self._roll(key)  # one file per schema
            part = None
        if part is None:
            part = self._open_part(out.schema, subtask)
            with self._lock:
                self._parts[key] = part
        part.write(out)
        if part.nbytes >= self.target_file_bytes:
            self._roll(key)

    def _roll(self, key: tuple[str, int]) -> None:
        """Close the in-progress file of *key* (if any) into its open transaction."""
        with self._lock:
            part = self._parts.pop(key, None)
        if part is not None:
            staged = part.close()
            with self._lock:
                self._open.setdefault(key, []).append(staged)

    def pre_commit(self, operator_uid: str, subtask: int, checkpoint_id: int) -> Transaction:
        """Close the in-progress file and seal the open transaction of (*operator_uid*,
        *subtask*) as the transaction of *checkpoint_id* (possibly empty)."""
        key = (operator_uid, subtask)
        self._roll(key)
        with self._lock:
            files = self._open.pop(key, [])
        payload = tuple(f.to_json() for f in files)
        return Transaction(operator_uid, subtask, checkpoint_id, payload, self.target.sink_id)

    def detach(self, operator_uid: str, subtask: int) -> tuple[str, ...]:
        """Close the in-progress file of (*operator_uid*, *subtask*) into its open
        transaction and hand the open transaction over (this writer forgets it): the
        staged files' JSON, which :meth:`attach` takes back, in this process or another.
        A subtask that runs one micro-batch per Spark task keeps them in its image."""
        key = (operator_uid, subtask)
        self._roll(key)
        with self._lock:
            files = self._open.pop(key, [])
        return tuple(f.to_json() for f in files)

    def attach(self, operator_uid: str, subtask: int, staged: tuple[str, ...]) -> None:
        """Resume the open transaction of (*operator_uid*, *subtask*) that :meth:`detach`
        handed over; it must have none here."""
        key = (operator_uid, subtask)
        with self._lock:
            if self._open.get(key) or key in self._parts:
                raise StoreError(
                    f"{operator_uid}#{subtask} already has an open transaction in this writer"
                )
            self._open[key] = [StagedFile.from_json(text) for text in staged]

    def discard(self, operator_uid: str) -> None:
        """Drop the open transactions of *operator_uid* in this writer, deleting their
        in-progress files (files already rolled stay on disk until the committer's orphan
        sweep). For a writer that outlives a failure of its tasks; a restarted job's writers
        start empty. Idempotent."""
        with self._lock:
            for key in [k for k in self._open if k[0] == operator_uid]:
                del self._open[key]
            parts = [self._parts.pop(k) for k in list(self._parts) if k[0] == operator_uid]
        for part in parts:
            part.discard()
