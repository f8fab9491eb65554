"""The committer of the Delta sink (Flink's ``Committer``): adds sealed transactions' staged
files to the Delta table idempotently, rolls back and recovers at a restore.

Runs in the sink vertex's global committer — the process hosting the coordinator, driver
side — after the checkpoint recording the transactions completed (see
:mod:`spark_ckpt.delta.delta_sink` for the protocol and the invariants that make the output
exactly-once). Every public call is idempotent and safe against a concurrent committer of the
same sink: each commit is an independent Delta transaction, never rebased.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake import Transaction as AppTransaction
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import create_table_with_add_actions

from spark_ckpt.delta.boundary import delta_boundary
from spark_ckpt.delta.followed_table import FollowedTable
from spark_ckpt.delta.output_schema import check_schema, delta_fields, output_table
from spark_ckpt.delta.sink_rollback import DeltaSinkRollback
from spark_ckpt.delta.sink_target import DeltaSinkTarget
from spark_ckpt.delta.staged_file import StagedFile, staged_files
from spark_ckpt.errors import ConfigError, ProtocolError, StoreError
from spark_ckpt.sinks.two_phase_commit import Transaction

log = logging.getLogger(__name__)

#: How often one commit is re-attempted after losing a commit race before giving up.
DEFAULT_MAX_ATTEMPTS = 64


def _boundary(what: str) -> AbstractContextManager[None]:
    """Translate delta-rs / Arrow / OS errors into :class:`StoreError`."""
    return delta_boundary(what, StoreError)


class DeltaSinkCommitter:
    """The :class:`~spark_ckpt.sinks.two_phase_commit.SinkCommitter` of a Delta sink writing to
    *target*.

    :meth:`commit_checkpoint` makes every file of all transactions of checkpoint *n*
    visible in **one** Delta commit that also records the app transaction
    (:attr:`DeltaSinkTarget.app_id <spark_ckpt.delta.sink_target.DeltaSinkTarget>`) at
    version *n*; :meth:`commit` adds one transaction's files and leaves the version where it
    is; :meth:`abort` and :meth:`recover` delete staged files that never became part of the
    table; :meth:`roll_back_to` removes this sink's output of checkpoints after a restored
    one. *max_attempts* bounds re-attempts of one commit after losing a race.

    Errors of delta-rs, Arrow and the file system raise :class:`StoreError`; staged data
    that does not fit the table raises :class:`ProtocolError` naming the columns. Reads go
    through the target's native pyarrow file system (delta-rs' default Python file system
    handler aborts the interpreter at exit in deltalake 1.6 + pyarrow 26). An instance may be
    shared by threads (every commit is an independent, retried Delta transaction)."""

    def __init__(
        self, target: DeltaSinkTarget, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS
    ) -> None:
        if max_attempts < 1:
            raise ConfigError("max_attempts", max_attempts, "an integer >= 1")
        self.target = target
        self.max_attempts = max_attempts
        self._table: FollowedTable | None = None  # built at the first read (picklable until)
        #: Rolls the table back at a restore, and checks a restore before it runs.
        self.rollback = DeltaSinkRollback(target, self._load, max_attempts=max_attempts)

    @property
    def sink_id(self) -> str:
        """The table URI: transactions sealed for another table are not this sink's."""
        return self.target.sink_id

    # -- reading the table -----------------------------------------------------------------
    def _load(self) -> DeltaTable | None:
        """The newest version of the table (``None`` before its first commit): opened once,
        then kept up to date (:class:`~spark_ckpt.delta.followed_table.FollowedTable`)."""
        if self._table is None:
            self._table = FollowedTable(self.target.table_uri, self.target.storage_options)
        return self._table.newest()

    @staticmethod
    def _table_paths(dt: DeltaTable) -> set[str]:
        actions = pa.table(dt.get_add_actions(flatten=True))
        return set(actions.column("path").to_pylist())

    def committed_checkpoint(self) -> int:
        """The sink's app-transaction version: every transaction sealed at a checkpoint <= it
        is in the table (0 if nothing was committed by :meth:`commit_checkpoint`)."""
        with _boundary(f"reading {self.target.table_uri}"):
            dt = self._load()
            version = None if dt is None else dt.transaction_version(self.target.app_id)
        return version or 0

    def ensure_table(self, schema: pa.Schema) -> None:
        """Create the table, empty, with the columns of *schema* (as the writer coerces
        them), unless it exists: for a sink that may receive nothing for long (a late-output
        table), so that its commits record the checkpoints it is up to even without files.
        Idempotent; safe against a concurrent creator."""
        with _boundary(f"creating {self.target.table_uri}"):
            if self._load() is not None:
                return
            columns = output_table(schema.empty_table()).schema
            try:
                create_table_with_add_actions(
                    self.target.table_uri,
                    DeltaSchema.from_arrow(columns),
                    [],
                    mode="error",
                    storage_options=self.target.storage_options,
                )
            except DeltaError:
                if self._load() is None:
                    raise

    def committed_files(self) -> set[str]:
        """Paths (relative to the root) of the data files of the current table version."""
        with _boundary(f"reading {self.target.table_uri}"):
            dt = self._load()
            return set() if dt is None else self._table_paths(dt)

    def read(self) -> pa.Table:
        """The current table content (an empty table without columns if it doesn't exist).
        Reads through the native pyarrow file system."""
        with _boundary(f"reading {self.target.table_uri}"):
            dt = self._load()
            if dt is None:
                return pa.table({})
            return dt.to_pyarrow_dataset(filesystem=self.target.fs).to_table()

    # -- committing ------------------------------------------------------------------------
    def commit(self, txn: Transaction) -> None:
        """Make *txn*'s files visible (driver side). Idempotent: files already in the table
        are skipped. Leaves the app version unchanged (a per-subtask commit must not claim
        the whole checkpoint); raises :class:`StoreError` if a file to add is gone."""
        self._commit(f"committing {txn.txn_id}", staged_files(txn), None, skip_reached=False)

    def commit_checkpoint(self, checkpoint_id: int, txns: Sequence[Transaction]) -> bool:
        """Make every file of *txns* (all transactions recorded in completed checkpoint
        *checkpoint_id*) visible in one Delta commit that sets the app version to *checkpoint_id*. A
        no-op returning ``False`` if the version is already >= *checkpoint_id* (see
        :mod:`spark_ckpt.delta.delta_sink` for why no file can be lost then) or if there is neither
        a table nor a file to create it from; ``True`` if it committed. Safe against concurrent
        committers of the same checkpoint."""
        if checkpoint_id < 0:
            raise ProtocolError(f"checkpoint id {checkpoint_id} is negative")

        def uncommitted(version: int | None) -> list[StagedFile]:
            # the commit that raised the app version to v carried every transaction sealed
            # up to v in its checkpoint (tasks keep a sealed transaction in every checkpoint
            # until they see it committed), so one of a checkpoint <= v is never added
            # again: a retried or zombie task's second attempt at it stays an orphan
            return [
                f
                for t in txns
                if version is None or t.checkpoint_id > version
                for f in staged_files(t)
            ]

        return self._commit(
            f"committing checkpoint {checkpoint_id}", uncommitted, checkpoint_id, skip_reached=True
        )

    def _commit(
        self,
        what: str,
        files: list[StagedFile] | Callable[[int | None], list[StagedFile]],
        checkpoint_id: int | None,
        *,
        skip_reached: bool,
    ) -> bool:
        """Add the *files* not yet in the table (a function: of the table's current app
        version) and raise the app version to *checkpoint_id* (``None``: keep it). With
        *skip_reached*, nothing is done once the version is >= *checkpoint_id*. Every commit
        carries the app transaction, so concurrent commits of this sink conflict and the
        loser retries on a fresh snapshot. Returns whether a Delta commit was made."""
        with _boundary(what):
            for _ in range(self.max_attempts):
                dt = self._load()
                current = None if dt is None else dt.transaction_version(self.target.app_id)
                reached = checkpoint_id is None or (current or -1) >= checkpoint_id
                if skip_reached and reached:
                    return False
                listed = files(current) if callable(files) else files
                unique = list({f.path: f for f in listed}.values())
                present = set() if dt is None else self._table_paths(dt)
                todo = [f for f in unique if f.path not in present]
                if not todo and (reached or dt is None):
                    return False  # nothing to add (or to create the table from)
                version = max(current or 0, checkpoint_id or 0)
                props = CommitProperties(
                    app_transactions=[AppTransaction(self.target.app_id, version)],
                    max_commit_retries=0,  # never rebased by delta-rs: our loop re-checks
                    custom_metadata={"spark-ckpt.sink": self.target.app_id},
                )
                schemas = [self._staged_schema(f) for f in todo]
                try:
                    if dt is None:
                        fields = delta_fields(schemas[0])
                        for f, s in zip(todo, schemas, strict=True):
                            check_schema(fields, s, f.path)
                        create_table_with_add_actions(
                            self.target.table_uri,
                            DeltaSchema.from_arrow(schemas[0]),
                            [f.add_action() for f in todo],
                            mode="error",
                            storage_options=self.target.storage_options,
                            commit_properties=props,
                        )
                    else:
                        fields = {
                            f["name"]: json.dumps(f["type"])
                            for f in json.loads(dt.schema().to_json())["fields"]
                        }
                        for f, s in zip(todo, schemas, strict=True):
                            check_schema(fields, s, f.path)
                        dt.create_write_transaction(
                            [f.add_action() for f in todo],
                            "append",
                            dt.schema(),
                            commit_properties=props,
                        )
                except CommitFailedError:
                    continue  # a concurrent commit of this sink: re-check on a fresh snapshot
                except DeltaError:
                    if dt is None and self._load() is not None:
                        continue  # lost the race to create the table
                    raise
                return True
        raise StoreError(f"{what}: lost {self.max_attempts} commit races in a row")

    def _staged_schema(self, f: StagedFile) -> pa.Schema:
        """The Arrow schema of staged file *f* (its Parquet footer); a missing file raises
        :class:`StoreError` — its data would be lost, and adding it would corrupt the table."""
        try:
            with self.target.fs.open_input_file(f.path) as src:
                return pq.read_schema(src).remove_metadata()
        except FileNotFoundError as e:
            raise StoreError(
                f"staged file {f.path} is gone: it cannot be committed (was it aborted?)"
            ) from e

    def roll_back_to(self, checkpoint_id: int) -> list[str]:
        """See :meth:`DeltaSinkRollback.roll_back_to
        <spark_ckpt.delta.sink_rollback.DeltaSinkRollback.roll_back_to>` (driver side, at a
        restore, **before** :meth:`recover`)."""
        return self.rollback.roll_back_to(checkpoint_id)

    def abort(self, txn: Transaction) -> None:
        """Delete *txn*'s staged files (missing ones are fine; files that any version of the
        table still references are kept — an abort after a commit must not corrupt the
        table, nor its time travel)."""
        self._delete([f.path for f in staged_files(txn)], f"aborting {txn.txn_id}")

    def referenced_files(self) -> set[str]:
        """Paths of the data files that some version of the table the log still describes
        references: those of the current version, and those removed from it whose removal
        the log keeps (Delta's tombstones, kept for ``delta.deletedFileRetentionDuration``;
        a ``VACUUM`` deletes them after that). Cost: the snapshot's tombstones, O(files
        removed within the retention)."""
        with _boundary(f"reading {self.target.table_uri}"):
            dt = self._load()
            if dt is None:
                return set()
            # a dry run of a VACUUM with no retention lists exactly the tombstones
            removed = dt.vacuum(retention_hours=0, dry_run=True, enforce_retention_duration=False)
            return self._table_paths(dt) | {unquote(p) for p in removed}

    def _delete(self, paths: Sequence[str], what: str) -> list[str]:
        """Delete those of *paths* that no version of the table references (see
        :meth:`referenced_files`); returns the paths deleted."""
        with _boundary(what):
            if not paths:
                return []
            present = self.committed_files()
            if any(p not in present for p in paths):
                present = self.referenced_files()
            deleted = []
            for path in paths:
                if path in present:
                    continue
                try:
                    self.target.fs.delete_file(path)
                    deleted.append(path)
                except FileNotFoundError:
                    pass
            return deleted

    def recover(
        self, to_commit: Sequence[Transaction], *, staged_before_ms: int | None = None
    ) -> None:
        """Flink's recover-and-commit plus recover-and-abort, once per job (re)start before any task
        writes (never concurrently with writers of this sink): add every file of *to_commit* (the
        transactions of the restored checkpoint) that is not yet in the table, raising the app
        version to their largest checkpoint id, then delete every staged file of this sink the table
        does not reference (orphans of failed or never completed checkpoints, and in-progress files
        of writers that died). With *staged_before_ms* only files staged before that time are
        orphans: files staged since belong to the run that is recovering (a ``ckpt-sink`` query
        stages its first micro-batch before the coordinator learns of it). Idempotent."""
        if to_commit:
            upto = max(t.checkpoint_id for t in to_commit)
            files = [f for t in to_commit for f in staged_files(t)]
            self._commit(f"recovering {self.target.app_id}", files, upto, skip_reached=False)
        self.delete_orphans(before_ms=staged_before_ms)

    def delete_orphans(self, *, before_ms: int | None = None) -> list[str]:
        """Delete this sink's staged files that no commit of the table added (staged files of
        checkpoints that never completed, a retried task's second attempt, in-progress files
        of writers that died); returns their paths. Files any version of the table still
        references stay (:meth:`referenced_files`): those a roll back or another writer
        (OPTIMIZE, DELETE) removed are left to a ``VACUUM`` under the table's
        ``delta.deletedFileRetentionDuration``, as for every other Delta writer; once their
        removal has left the log (beyond that retention) they are deleted here too. Must not
        run concurrently with writers of this sink. With *before_ms*, only files last
        modified before that time are considered. Cost: one listing of the table root and
        the snapshot's tombstones."""
        return self._delete(
            self.target.staged_paths(before_ms=before_ms),
            f"deleting orphans of {self.target.app_id}",
        )
