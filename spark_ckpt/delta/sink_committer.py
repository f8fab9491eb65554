"""The committer of the Delta sink (Flink's ``Committer``): adds sealed transactions' staged
files to the Delta table idempotently, rolls back and recovers at a restore.

Runs in the sink vertex's global committer — the process hosting the coordinator, driver
side — after the checkpoint recording the transactions completed (see
:mod:`spark_ckpt.delta.sink` for the protocol and the invariants that make the output
exactly-once). Every public call is idempotent and safe against a concurrent committer of the
same sink: each commit is an independent Delta transaction, never rebased.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake import Transaction as AppTransaction
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from spark_ckpt.delta.errors import delta_boundary
from spark_ckpt.delta.output_schema import check_schema, delta_fields
from spark_ckpt.delta.sink_target import DeltaSinkTarget
from spark_ckpt.delta.staged_file import StagedFile, staged_files
from spark_ckpt.delta.store_tables import FollowedTable
from spark_ckpt.errors import ConfigError, ProtocolError, RestoreError, StoreError
from spark_ckpt.sinks.sink import Transaction

#: How often one commit is re-attempted after losing a commit race before giving up.
DEFAULT_MAX_ATTEMPTS = 64


def _boundary(what: str) -> AbstractContextManager[None]:
    """Translate delta-rs / Arrow / OS errors into :class:`StoreError`."""
    return delta_boundary(what, StoreError)


class DeltaSinkCommitter:
    """The :class:`~spark_ckpt.sinks.sink.SinkCommitter` of a Delta sink writing to *target*.

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

    @property
    def sink_id(self) -> str:
        """The table URI: transactions sealed for another table are not this sink's."""
        return self.target.sink_id

    # -- reading the table -----------------------------------------------------------------
    def _load(self) -> DeltaTable | None:
        """The newest version of the table (``None`` before its first commit): opened once,
        then kept up to date (:class:`~spark_ckpt.delta.store_tables.FollowedTable`)."""
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
        *checkpoint_id*) visible in one Delta commit that sets the app version to
        *checkpoint_id*. A no-op returning ``False`` if the version is already >=
        *checkpoint_id* (see :mod:`spark_ckpt.delta.sink` for why no file can be lost then) or if
        there is neither a table nor a file to create it from; ``True`` if it committed.
        Safe against concurrent committers of the same checkpoint."""
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
        """Make the table hold exactly this sink's output of checkpoints <= *checkpoint_id*
        again (driver side, at a restore from *checkpoint_id*, **before** :meth:`recover`).

        This sink's output is everything the pipeline committed into the table, whichever
        version of the job (operator chain) wrote it: commits under the app id, and under
        the per-vertex app ids of versions before 0.2
        (:meth:`DeltaSinkTarget.is_own_app_id
        <spark_ckpt.delta.sink_target.DeltaSinkTarget.is_own_app_id>`).

        When the app version is above *checkpoint_id* (or the app id has no version yet and
        older app ids may): remove (Delta ``remove`` actions with ``dataChange=true``; the
        files stay on disk until the orphan sweep of :meth:`recover`) every file still in the
        table that one of this sink's commits added with an app version > *checkpoint_id*
        after the sink's newest commit at or below it, and set the app version — and that of
        every older app id above it — to *checkpoint_id*: one Delta commit, on exactly the
        snapshot read (``max_commit_retries=0``; a concurrent commit makes it re-read and
        redo, :class:`StoreError` after ``max_attempts`` lost races). Returns the paths
        removed (sorted); a no-op returning ``[]`` when there is no table or nothing of the
        sink is above *checkpoint_id* (so it is idempotent).

        Transactions of checkpoints <= *checkpoint_id* that a later checkpoint's commit
        added (checkpoint *checkpoint_id*'s own commit was lost in a crash) are removed too:
        :meth:`recover` with the restored checkpoint's transactions adds them back, which is
        why it must follow.

        Files of other writers (other pipelines, plain appends) are never removed. Output of
        this sink that another writer rewrote (OPTIMIZE, DELETE, ...) is no longer in the
        table under its name and cannot be rolled back; its files are skipped. The commits
        to undo are found in the log's JSON commits, newest first (see
        :meth:`_added_after`); if one that is needed has been cleaned up (log retention),
        :class:`StoreError` says so. Tables with ``delta.appendOnly=true`` refuse remove
        actions (:class:`StoreError`). Whether the table can hold the output up to
        *checkpoint_id* at all (an earlier roll back may have withdrawn it) is the driver's
        check before a restore (:meth:`check_output_restorable`)."""
        if checkpoint_id < 0:
            raise ProtocolError(f"checkpoint id {checkpoint_id} is negative")
        what = f"rolling the output of {self.target.app_id} back to checkpoint {checkpoint_id}"
        with _boundary(what):
            for _ in range(self.max_attempts):
                dt = self._load()
                if dt is None:
                    return []
                own = dt.transaction_version(self.target.app_id)
                if own is not None and own <= checkpoint_id:
                    return []
                added, app_ids = self._added_after(dt, checkpoint_id, what, strict=own is not None)
                above = sorted(
                    a
                    for a in app_ids | {self.target.app_id}
                    if (dt.transaction_version(a) or 0) > checkpoint_id
                )
                if not above:
                    return []
                actions = pa.table(dt.get_add_actions(flatten=True))
                sizes = dict(
                    zip(
                        actions.column("path").to_pylist(),
                        actions.column("size_bytes").to_pylist(),
                        strict=True,
                    )
                )
                doomed = sorted(p for p in added if p in sizes)
                now_ms = time.time_ns() // 1_000_000
                removes: list[AddAction | RemoveAction] = [
                    RemoveAction(p, True, now_ms, sizes[p]) for p in doomed
                ]
                reset = sorted({self.target.app_id, *above})
                props = CommitProperties(
                    app_transactions=[AppTransaction(a, checkpoint_id) for a in reset],
                    max_commit_retries=0,  # never rebased by delta-rs: our loop re-checks
                    custom_metadata={
                        "spark-ckpt.sink": self.target.app_id,
                        "spark-ckpt.rollback": str(checkpoint_id),
                    },
                )
                try:
                    dt.create_write_transaction(
                        removes, "append", dt.schema(), commit_properties=props
                    )
                except CommitFailedError:
                    continue  # a concurrent commit: re-check on a fresh snapshot
                return doomed
        raise StoreError(f"{what}: lost {self.max_attempts} commit races in a row")

    def check_output_restorable(self, checkpoint_id: int) -> None:
        """Refuse a restore whose output the table can no longer hold: a roll back to an
        earlier checkpoint *c* (the restore of *c*) withdrew the output of checkpoints in
        (*c*, *checkpoint_id*] since *checkpoint_id* completed, and the sink's recovery
        deleted those files, so restoring *checkpoint_id* would leave that output missing
        (its sources resume after it). Raises :class:`RestoreError` naming both
        checkpoints; a no-op for any other table (read-only, driver side, before the
        restore changes anything). Walks the log's JSON commits newest first, down to the
        sink's newest commit at or below *checkpoint_id*."""
        what = f"checking the output of checkpoint {checkpoint_id} in {self.target.table_uri}"
        with _boundary(what):
            dt = self._load()
            if dt is None:
                return
            withdrawn_to = self._withdrawn_to(dt, checkpoint_id)
        if withdrawn_to is not None:
            raise RestoreError(
                f"the output table {self.target.table_uri} no longer holds the output of "
                f"checkpoints {withdrawn_to + 1}..{checkpoint_id}: the restore of checkpoint "
                f"{withdrawn_to} withdrew it after checkpoint {checkpoint_id} completed. "
                f"Restore checkpoint {withdrawn_to} or a later one of the current lineage, or "
                "restore into another output table"
            )

    def _withdrawn_to(self, dt: DeltaTable, checkpoint_id: int) -> int | None:
        """The target *c* < *checkpoint_id* of the roll back that withdrew output of
        checkpoints in (*c*, *checkpoint_id*], if the newest state of the table below
        *checkpoint_id* is one a roll back made (its commit, or the recovery commit right
        after it); ``None`` otherwise. Commits above *checkpoint_id* are skipped (a roll
        back to it withdraws them)."""
        found: int | None = None  # the app version of the sink's newest commit <= target
        for version in range(dt.version(), -1, -1):
            actions = self._log_commit(version)
            if actions is None:
                return None  # cleaned up: nothing more to learn
            mine = [
                int(a["txn"]["version"])
                for a in actions
                if "txn" in a and self.target.is_own_app_id(str(a["txn"].get("appId", "")))
            ]
            if not mine or max(mine) > checkpoint_id:
                continue
            top = max(mine)
            rolled_back = any(
                "commitInfo" in a and "spark-ckpt.rollback" in a["commitInfo"] for a in actions
            )
            if found is None:
                if top == checkpoint_id:
                    return None  # the checkpoint's own output (or a roll back to it)
                found = top
            elif top != found:
                return None  # a normal commit of an earlier checkpoint: nothing withdrawn
            if rolled_back:
                return found  # a roll back to `found` < checkpoint_id made this state
        return None

    def _log_commit(self, version: int) -> list[dict[str, Any]] | None:
        """The actions of the log's JSON commit *version* (``None`` if the file is gone)."""
        try:
            with self.target.fs.open_input_stream(f"_delta_log/{version:020d}.json") as src:
                text = src.read().decode()
        except FileNotFoundError:
            return None
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def _added_after(
        self, dt: DeltaTable, checkpoint_id: int, what: str, *, strict: bool
    ) -> tuple[set[str], set[str]]:
        """Paths (relative to the root, decoded) that this sink's commits with an app
        version > *checkpoint_id* added after its newest commit whose app versions are all
        <= *checkpoint_id* (since the table's first version if there is none), read from the
        log's JSON commits from *dt*'s version down: normally a few recent commits; and the
        sink's app ids those commits carried.

        Sound because the sink's app version only falls by a roll back, which removes
        everything above its target: at this sink's newest commit with an app version <= the
        target, none of its files in the table came from a later checkpoint. When the walk
        reaches a JSON commit that has been cleaned up (log retention), the snapshot just
        before the oldest commit of this sink that the walk saw decides (it is readable from
        a log checkpoint, and has the app versions of the commit that is gone): with app
        versions <= *checkpoint_id*, or none, the walk is complete; otherwise — or if that
        snapshot cannot be loaded — the files to remove cannot be known: :class:`StoreError`.
        Without *strict* (the app id has no version: only older app ids may be above), a
        walk that saw none of the sink's commits before the cleaned-up one ends quietly."""
        added: set[str] = set()
        app_ids: set[str] = set()
        newest = dt.version()
        oldest_mine = newest + 1  # the oldest commit of this sink the walk has seen
        for version in range(newest, -1, -1):
            actions = self._log_commit(version)
            if actions is None:
                if strict or app_ids:
                    self._check_cleaned_up(
                        version, oldest_mine - 1, newest, checkpoint_id, what, app_ids
                    )
                break
            mine = {
                str(a["txn"]["appId"]): int(a["txn"]["version"])
                for a in actions
                if "txn" in a and self.target.is_own_app_id(str(a["txn"].get("appId", "")))
            }
            if not mine:
                continue  # another writer's commit
            if max(mine.values()) <= checkpoint_id:
                break
            oldest_mine = version
            app_ids |= set(mine)
            added |= {unquote(a["add"]["path"]) for a in actions if "add" in a}
        return added, app_ids

    def _check_cleaned_up(
        self,
        gone: int,
        probe: int,
        newest: int,
        checkpoint_id: int,
        what: str,
        app_ids: set[str],
    ) -> None:
        """JSON commit *gone* is missing and no commit in (*gone*, *probe*] carries this
        sink's app transactions, so the app versions after *gone* are those of snapshot
        *probe*: return if they are <= *checkpoint_id* (or absent), raise
        :class:`StoreError` if one is above or the snapshot cannot be read."""
        lost = StoreError(
            f"{what}: the Delta log's commit {gone} (_delta_log/{gone:020d}.json) has been "
            f"cleaned up (log retention), so the files this sink committed after checkpoint "
            f"{checkpoint_id} cannot be determined; restore a newer checkpoint or remove "
            "them by hand"
        )
        if probe >= newest:
            raise lost  # the newest snapshot's app version is above checkpoint_id
        try:
            before = DeltaTable(
                self.target.table_uri, version=probe, storage_options=self.target.storage_options
            )
        except DeltaError as e:
            raise lost from e
        for app_id in app_ids | {self.target.app_id}:
            if (before.transaction_version(app_id) or 0) > checkpoint_id:
                raise lost

    # -- aborting and recovery -------------------------------------------------------------
    def abort(self, txn: Transaction) -> None:
        """Delete *txn*'s staged files (missing ones are fine; files the table references
        are kept — an abort after a commit must not corrupt the table)."""
        self._delete([f.path for f in staged_files(txn)], f"aborting {txn.txn_id}")

    def _delete(self, paths: Sequence[str], what: str) -> list[str]:
        with _boundary(what):
            present = self.committed_files() if paths else set()
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
        """Delete this sink's staged files that the current table version does not reference;
        returns their paths. Must not run concurrently with writers of this sink. Caveat: a
        file of this sink that another writer logically removed from the table (OPTIMIZE,
        DELETE) is unreferenced too and is deleted like ``VACUUM RETAIN 0 HOURS`` would,
        breaking time travel to versions before that removal. With *before_ms*, only files
        last modified before that time are considered."""
        return self._delete(
            self.target.staged_paths(before_ms=before_ms),
            f"deleting orphans of {self.target.app_id}",
        )
