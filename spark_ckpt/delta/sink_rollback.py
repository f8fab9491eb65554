"""Rolling a Delta sink's output back to a restored checkpoint, and checking before a restore
that the table can hold that checkpoint's output (driver side: the coordinator host at a
restore; the user's driver before it). The plan comes from the log's JSON commits
(:mod:`spark_ckpt.delta.rollback_plan`); see :mod:`spark_ckpt.delta.delta_sink` for the
invariants it keeps."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, date, datetime
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable
from deltalake import Transaction as AppTransaction
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction

from spark_ckpt.delta.boundary import delta_boundary
from spark_ckpt.delta.log_commits import DamagedCommitError, read_commit
from spark_ckpt.delta.rollback_plan import CleanedUpLog, OwnCommit, RollbackPlan, plan_rollback
from spark_ckpt.delta.sink_target import DeltaSinkTarget
from spark_ckpt.delta.staged_file import staged_files
from spark_ckpt.errors import ProtocolError, RestoreError, StoreError
from spark_ckpt.sinks.two_phase_commit import Transaction

log = logging.getLogger(__name__)


class DeltaSinkRollback:
    """The roll back of the Delta sink writing to *target*: *load* returns the table's newest
    version (``None`` before its first commit), as the sink's committer follows it;
    *max_attempts* bounds re-attempts after losing a commit race. Safe against a concurrent
    committer of the same sink (every commit is on exactly the snapshot read)."""

    def __init__(
        self,
        target: DeltaSinkTarget,
        load: Callable[[], DeltaTable | None],
        *,
        max_attempts: int,
    ) -> None:
        self.target = target
        self._load = load
        self.max_attempts = max_attempts

    @property
    def sink_id(self) -> str:
        return self.target.sink_id

    @staticmethod
    def _table_paths(dt: DeltaTable) -> set[str]:
        actions = pa.table(dt.get_add_actions(flatten=True))
        return set(actions.column("path").to_pylist())

    def roll_back_to(self, checkpoint_id: int) -> list[str]:
        """Make the table hold exactly this sink's output of checkpoints <= *checkpoint_id* again
        (driver side, at a restore from *checkpoint_id*, **before**
        :meth:`DeltaSinkCommitter.recover
        <spark_ckpt.delta.sink_committer.DeltaSinkCommitter.recover>`).

        This sink's output is everything the pipeline committed into the table, whichever
        version of the job (operator chain) wrote it: commits under the app id, and under
        the per-vertex app ids of versions before 0.2
        (:meth:`DeltaSinkTarget.is_own_app_id
        <spark_ckpt.delta.sink_target.DeltaSinkTarget.is_own_app_id>`).

        The state to bring back is found in the log's JSON commits, newest first
        (:func:`~spark_ckpt.delta.rollback_plan.plan_rollback`): the table version (the
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
        too: the committer's ``recover`` with the restored checkpoint's transactions adds them back,
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
        with delta_boundary(what, StoreError):
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
          (:attr:`~spark_ckpt.delta.rollback_plan.RollbackPlan.withdrawn_to`);
        * the roll back would add back files that are gone from storage (a ``VACUUM`` with a
          retention shorter than the restored checkpoint's age deleted them);
        * files of this sink's *transactions* that the table does not hold are gone (never
          committed, they were swept as orphans by the recovery of an earlier restore).

        Raises :class:`RestoreError` naming the checkpoints. Cost: as :meth:`roll_back_to`'s
        plan, plus one look-up per file to add back or commit."""
        what = f"checking the output of checkpoint {checkpoint_id} in {self.target.table_uri}"
        with delta_boundary(what, StoreError):
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
        (:mod:`~spark_ckpt.delta.rollback_plan`)."""
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
