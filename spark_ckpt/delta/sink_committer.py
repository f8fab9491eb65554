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
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, date, datetime
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake import Transaction as AppTransaction
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from spark_ckpt.delta.boundary import delta_boundary
from spark_ckpt.delta.followed_table import FollowedTable
from spark_ckpt.delta.log_commits import DamagedCommitError, read_commit
from spark_ckpt.delta.output_schema import check_schema, delta_fields
from spark_ckpt.delta.sink_rollback import CleanedUpLog, OwnCommit, RollbackPlan, plan_rollback
from spark_ckpt.delta.sink_target import DeltaSinkTarget
from spark_ckpt.delta.staged_file import StagedFile, staged_files
from spark_ckpt.errors import ConfigError, ProtocolError, RestoreError, StoreError
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
        """Make the table hold exactly this sink's output of checkpoints <= *checkpoint_id*
        again (driver side, at a restore from *checkpoint_id*, **before** :meth:`recover`).

        This sink's output is everything the pipeline committed into the table, whichever
        version of the job (operator chain) wrote it: commits under the app id, and under
        the per-vertex app ids of versions before 0.2
        (:meth:`DeltaSinkTarget.is_own_app_id
        <spark_ckpt.delta.sink_target.DeltaSinkTarget.is_own_app_id>`).

        The state to bring back is found in the log's JSON commits, newest first
        (:func:`~spark_ckpt.delta.sink_rollback.plan_rollback`): the table version (the
        *base*) at which the sink's output was that of checkpoint *checkpoint_id*, or the
        newest before it. One Delta commit, on exactly the snapshot read
        (``max_commit_retries=0``; a concurrent commit makes it re-read and redo,
        :class:`StoreError` after ``max_attempts`` lost races), then:

        * **withdraws** with Delta ``remove`` actions (``dataChange=true``) every file of the
          sink still in the table that a commit after the base added and the base does not
          hold. The files stay on storage: every earlier version still reads, until a
          ``VACUUM`` removes them under the table's ``delta.deletedFileRetentionDuration``;
        * **adds back** the files of the base that a later roll back withdrew (a restore of
          a checkpoint past an earlier restore): all must still be on storage, else
          :class:`RestoreError` and nothing changes;
        * sets the app version — and that of every older app id above it — to
          *checkpoint_id*.

        Returns the paths withdrawn (sorted); a no-op returning ``[]`` when the table already
        holds that state (so it is idempotent) or does not exist.

        Transactions of checkpoints <= *checkpoint_id* that a later checkpoint's commit
        added (checkpoint *checkpoint_id*'s own commit was lost in a crash) are withdrawn
        too: :meth:`recover` with the restored checkpoint's transactions adds them back,
        which is why it must follow.

        Files of other writers (other pipelines, plain appends) are never touched. Output of
        this sink that another writer rewrote (OPTIMIZE, DELETE, ...) is no longer in the
        table under its name and cannot be rolled back; its files are skipped. If a JSON
        commit the walk needs has been cleaned up (log retention), :class:`StoreError` says
        so. Tables with ``delta.appendOnly=true`` refuse remove actions
        (:class:`StoreError`). Whether the state can be brought back at all is the driver's
        check before a restore (:meth:`check_output_restorable`). Cost: the JSON commits
        since the base, and the base's snapshot when files come back."""
        if checkpoint_id < 0:
            raise ProtocolError(f"checkpoint id {checkpoint_id} is negative")
        what = f"rolling the output of {self.target.app_id} back to checkpoint {checkpoint_id}"
        with _boundary(what):
            for _ in range(self.max_attempts):
                dt = self._load()
                if dt is None:
                    return []
                plan = self._plan(dt, checkpoint_id, what)
                current = pa.table(dt.get_add_actions(flatten=True))
                sizes = dict(
                    zip(
                        current.column("path").to_pylist(),
                        current.column("size_bytes").to_pylist(),
                        strict=True,
                    )
                )
                readd, kept = self._readd(plan, set(sizes), what)
                doomed = sorted(p for p in plan.added_after - kept if p in sizes)
                above = sorted(
                    a
                    for a in plan.app_ids | {self.target.app_id}
                    if (dt.transaction_version(a) or 0) > checkpoint_id
                )
                own = dt.transaction_version(self.target.app_id)
                raise_to = bool(readd) and (own is None or own < checkpoint_id)
                if not (doomed or readd or above or raise_to):
                    return []
                now_ms = time.time_ns() // 1_000_000
                actions: list[AddAction | RemoveAction] = [
                    RemoveAction(p, True, now_ms, sizes[p]) for p in doomed
                ]
                actions += readd
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
                        actions, "append", dt.schema(), commit_properties=props
                    )
                except CommitFailedError:
                    continue  # a concurrent commit: re-check on a fresh snapshot
                if readd:
                    log.info(
                        "rolling %s back to checkpoint %d: added back %d files an earlier "
                        "restore had withdrawn",
                        self.target.table_uri,
                        checkpoint_id,
                        len(readd),
                    )
                return doomed
        raise StoreError(f"{what}: lost {self.max_attempts} commit races in a row")

    def check_output_restorable(
        self, checkpoint_id: int, transactions: Sequence[Transaction] = ()
    ) -> None:
        """Refuse a restore whose output the table can no longer hold (read-only, driver
        side, before the restore changes anything). *transactions* are those the restored
        checkpoint sealed (its recovery commits this sink's ones):

        * an earlier roll back to *c* < *checkpoint_id* withdrew the output of checkpoints
          above *c*, and the log no longer tells whether *checkpoint_id* was among them
          (:attr:`~spark_ckpt.delta.sink_rollback.RollbackPlan.withdrawn_to`);
        * the roll back would add back files that are gone from storage (a ``VACUUM`` with a
          retention shorter than the restored checkpoint's age deleted them);
        * files of this sink's *transactions* that the table does not hold are gone (never
          committed, they were swept as orphans by the recovery of an earlier restore).

        Raises :class:`RestoreError` naming the checkpoints. Cost: as :meth:`roll_back_to`'s
        plan, plus one look-up per file to add back or commit."""
        what = f"checking the output of checkpoint {checkpoint_id} in {self.target.table_uri}"
        with _boundary(what):
            dt = self._load()
            held = set() if dt is None else self._table_paths(dt)
            plan = None if dt is None else self._plan(dt, checkpoint_id, what)
            if plan is not None:
                self._readd(plan, held, what)
            staged = sorted(
                {
                    f.path
                    for t in transactions
                    if not t.sink or t.sink == self.sink_id
                    for f in staged_files(t)
                }
                - held
            )
            gone = [
                i.path
                for i in self.target.fs.get_file_info(staged)
                if i.type == pafs.FileType.NotFound
            ]
        if plan is not None and plan.withdrawn_to is not None:
            raise RestoreError(
                f"the output table {self.target.table_uri} no longer holds the output of "
                f"checkpoints {plan.withdrawn_to + 1}..{checkpoint_id}: the restore of checkpoint "
                f"{plan.withdrawn_to} withdrew it after checkpoint {checkpoint_id} completed. "
                f"Restore checkpoint {plan.withdrawn_to} or a later one of the current lineage, "
                "or restore into another output table"
            )
        if gone:
            raise RestoreError(
                f"the output of checkpoint {checkpoint_id} that its commit never made visible "
                f"in {self.target.table_uri} is gone from storage ({len(gone)} files, e.g. "
                f"{gone[0]}: the recovery of an earlier restore deleted them as orphans). "
                "Restore a later checkpoint, or restore into another output table"
            )

    def _plan(self, dt: DeltaTable, checkpoint_id: int, what: str) -> RollbackPlan:
        """The roll back plan of *checkpoint_id* on snapshot *dt*, from the log's JSON
        commits walked newest first down to the base
        (:mod:`~spark_ckpt.delta.sink_rollback`)."""
        newest = dt.version()
        strict = dt.transaction_version(self.target.app_id) is not None
        walked: list[int] = []

        def commits() -> Iterator[OwnCommit]:
            for version in range(newest, -1, -1):
                actions = self._log_commit(version)
                if actions is None:
                    if strict or walked:
                        yield self._probe(walked[-1] - 1 if walked else newest, dt)
                    return
                own = {
                    str(a["txn"]["appId"]): int(a["txn"]["version"])
                    for a in actions
                    if "txn" in a and self.target.is_own_app_id(str(a["txn"].get("appId", "")))
                }
                if not own:
                    continue  # another writer's commit
                walked.append(version)
                yield OwnCommit(
                    version,
                    own,
                    rollback=any(
                        "commitInfo" in a and "spark-ckpt.rollback" in a["commitInfo"]
                        for a in actions
                    ),
                    adds=frozenset(unquote(a["add"]["path"]) for a in actions if "add" in a),
                    removes=frozenset(
                        unquote(a["remove"]["path"]) for a in actions if "remove" in a
                    ),
                )

        try:
            plan = plan_rollback(commits(), checkpoint_id)
        except CleanedUpLog:
            gone = (walked[-1] if walked else newest + 1) - 1
            while gone >= 0 and self._log_commit(gone) is not None:
                gone -= 1
            raise StoreError(
                f"{what}: the Delta log's commit {gone} (_delta_log/{gone:020d}.json) has been "
                f"cleaned up (log retention), so the files this sink committed after checkpoint "
                f"{checkpoint_id} cannot be determined; restore a newer checkpoint or remove "
                "them by hand"
            ) from None
        if not strict and not walked:
            return RollbackPlan(checkpoint_id, newest)  # never committed under the app id
        return plan

    def _probe(self, version: int, newest: DeltaTable) -> OwnCommit:
        """The app versions of snapshot *version* (the newest state before a cleaned-up
        commit), as a ``probe`` commit; one that cannot be loaded counts as above every
        checkpoint (nothing can be learned from it)."""
        try:
            dt = (
                newest
                if version == newest.version()
                else DeltaTable(
                    self.target.table_uri,
                    version=version,
                    storage_options=self.target.storage_options,
                )
            )
        except DeltaError:
            return OwnCommit(version, {self.target.app_id: 2**63 - 1}, probe=True)
        # app ids of versions before 0.2 are unknown here; the current one decides
        found = dt.transaction_version(self.target.app_id)
        return OwnCommit(version, {} if found is None else {self.target.app_id: found}, probe=True)

    def _readd(
        self, plan: RollbackPlan, current: set[str], what: str
    ) -> tuple[list[AddAction | RemoveAction], set[str]]:
        """The add actions that bring back the base's files a later roll back withdrew, and
        the files added after the base that the base holds too (added back by a restore in
        between: they stay); :class:`RestoreError` if a file to bring back is gone from
        storage. Loads the base's snapshot only when a roll back after it withdrew files."""
        if not plan.removed_after or plan.base is None:
            return [], set()
        base = DeltaTable(
            self.target.table_uri, version=plan.base, storage_options=self.target.storage_options
        )
        files = pa.table(base.get_add_actions(flatten=False))
        held = set(files.column("path").to_pylist())
        candidates = sorted((plan.removed_after - current) & held)
        wanted = files.filter(pc.is_in(files.column("path"), pa.array(candidates, pa.string())))
        missing = [
            i.path
            for i in self.target.fs.get_file_info(candidates)
            if i.type == pafs.FileType.NotFound
        ]
        if missing:
            raise RestoreError(
                f"{what}: {len(missing)} of the {len(candidates)} output files that table "
                f"version {plan.base} of {self.target.table_uri} held are gone from storage (a "
                f"VACUUM deleted them, e.g. {missing[0]}), so its output of checkpoint "
                f"{plan.checkpoint_id} cannot be brought back. Restore a later checkpoint, or "
                "restore into another output table"
            )
        return _add_actions(wanted), held & plan.added_after

    def _log_commit(self, version: int) -> list[dict[str, Any]] | None:
        """The actions of the log's JSON commit *version* (``None`` if the file is gone)."""
        try:
            return read_commit(self.target.fs, version)
        except DamagedCommitError as e:
            raise StoreError(f"the Delta log of {self.target.table_uri} is damaged: {e}") from e

    # -- aborting and recovery -------------------------------------------------------------
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


def _json_stat(value: Any) -> Any:
    """A statistics value as the Delta log writes it; ``None`` when it cannot be written
    exactly (the column then has no bound for that file: always safe)."""
    if isinstance(value, dict):
        out = {k: _json_stat(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not None}
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC)
        return value.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bool | int | float | str):
        return value
    return None


def _add_actions(files: pa.Table) -> list[AddAction | RemoveAction]:
    """Add actions (``dataChange=true``) for the files of a snapshot's add actions *files*
    (``get_add_actions(flatten=False)``), with their statistics. O(files)."""
    out: list[AddAction | RemoveAction] = []
    columns = set(files.column_names)
    for row in files.to_pylist():
        stats: dict[str, Any] = {"numRecords": row.get("num_records")}
        for key, name in (("minValues", "min"), ("maxValues", "max"), ("nullCount", "null_count")):
            if name in columns and row.get(name) is not None:
                stats[key] = _json_stat(row[name])
        partitions = row.get("partition_values") or {}
        out.append(
            AddAction(
                row["path"],
                row["size_bytes"],
                {k: None if v is None else str(v) for k, v in partitions.items()},
                row["modification_time"],
                True,
                json.dumps(
                    {k: v for k, v in stats.items() if v is not None}, separators=(",", ":")
                ),
            )
        )
    return out
