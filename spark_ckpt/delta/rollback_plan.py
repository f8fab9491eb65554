"""Which state of a Delta sink's output a restore of checkpoint *c* brings back, decided from
the sink's own commits in the Delta log (pure: no I/O; the committer walks the log).

The sink's app-transaction version (its *top*) rises with every checkpoint it commits and
falls only by a roll back, whose commit is flagged and sets it to the restored checkpoint.
Checkpoint ids are never reused, and a run that restores leases ids above every earlier one,
so the table's state "as of checkpoint *c*" is found walking the sink's commits newest first:

* a commit whose top is above *c* is output to withdraw (a later checkpoint, or a later
  lineage);
* a commit whose top is *c* is the state sought (*c*'s own commit, a roll back to *c*, or
  the recovery right after it): the **base**;
* a normal commit whose top is below *c* is the newest state before *c* (*c*'s own commit was
  lost in a crash; the restored checkpoint's transactions, which the recovery commits next,
  hold the rest): the base;
* a roll back to *r* < *c* (with the recovery commits at *r* right after it) withdrew output of
  checkpoints above *r*: if *c* was among them, its own commit lies further back and the walk
  goes on to find it; the files the roll back removed come back from the base.

When the walk passes a roll back below *c* and then finds no commit of *c* (the log was
cleaned up, or *c*'s own commit was lost before that roll back), the table may not tell
whether *c* belongs to the lineage that roll back ended or the one it began. It does when the
walk, past the roll back, meets a commit whose top is above *c*: that id was issued before the
roll back, and every id issued after it is above it, so *c* was issued before the roll back
too and belongs to the lineage it ended; the newest state before *c* there is the base, and
the files the roll backs since withdrew come back. Otherwise the plan is **ambiguous**, a
restore of *c* is refused (:attr:`RollbackPlan.withdrawn_to`), and a roll back to *c* keeps
the roll back's state (a restart restoring *c* of the later lineage)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class OwnCommit:
    """One commit of the sink in the Delta log (or, with *probe*, the snapshot before a
    cleaned-up part of the log, known only by its app versions). *app_versions*: the sink's
    app ids and versions it set; *adds*/*removes*: the data file paths it added/removed
    (decoded, relative to the table root)."""

    version: int
    app_versions: Mapping[str, int]
    rollback: bool = False
    adds: frozenset[str] = frozenset()
    removes: frozenset[str] = frozenset()
    probe: bool = False

    @property
    def top(self) -> int:
        return max(self.app_versions.values(), default=-1)


@dataclass(frozen=True)
class RollbackPlan:
    """A roll back to *checkpoint_id*: the table version *base* whose output of the sink the
    table must hold again (``None``: the state before the sink's first commit), and the sink's
    commits after it, newest first. *withdrawn_to*, when set, makes the plan ambiguous (see
    the module docstring): a roll back to that checkpoint withdrew output up to at least
    *checkpoint_id*, and *base* is that roll back's state."""

    checkpoint_id: int
    base: int | None
    after: tuple[OwnCommit, ...] = ()
    withdrawn_to: int | None = None

    @property
    def added_after(self) -> set[str]:
        """Files the sink's commits after the base added (candidates to withdraw)."""
        return {p for c in self.after for p in c.adds}

    @property
    def removed_after(self) -> set[str]:
        """Files the sink's roll backs after the base removed (candidates to add back)."""
        return {p for c in self.after if c.rollback for p in c.removes}

    @property
    def app_ids(self) -> set[str]:
        """The sink's app ids the commits after the base carried."""
        return {a for c in self.after for a in c.app_versions}


class CleanedUpLog(Exception):
    """The walk met a cleaned-up commit while the commits before it still matter."""


def plan_rollback(commits: Iterable[OwnCommit], checkpoint_id: int) -> RollbackPlan:
    """The plan of a roll back to *checkpoint_id* from the sink's commits, newest first (see
    the module docstring). A commit with ``probe`` stands for the snapshot before a cleaned-up
    part of the log and must come last: with a top above *checkpoint_id* (and no roll back
    passed) the files to withdraw cannot be known, :class:`CleanedUpLog`. Reads only as far
    as it must: O(commits of the sink since the base)."""
    c = checkpoint_id
    after: list[OwnCommit] = []
    pending: list[OwnCommit] = []  # normal commits sharing one top below c, newest first
    rolled_back: tuple[int, int] | None = None  # (top, newest version) of a roll back's state
    ended = False  # past the roll back, a commit above c: c is of the lineage it ended

    def at(version: int | None) -> RollbackPlan:
        if rolled_back is None or ended:
            return RollbackPlan(c, version, tuple(after))
        top, newest = rolled_back
        return RollbackPlan(c, newest, tuple(a for a in after if a.version > newest), top)

    for commit in commits:
        if pending and not (commit.rollback and commit.top == pending[0].top):
            return at(pending[0].version)  # a normal state below c
        if commit.probe and commit.top > c:
            if rolled_back is None:
                raise CleanedUpLog
            ended = False  # the base is in the cleaned-up part: ambiguous
            return at(None)
        if commit.top > c:
            ended = ended or rolled_back is not None
            after.append(commit)
        elif commit.top == c:
            return RollbackPlan(c, commit.version, tuple(after))
        elif commit.rollback:
            group, pending = [*pending, commit], []
            if rolled_back is None:
                rolled_back = (commit.top, group[0].version)
            after.extend(group)
        elif commit.probe:
            return at((pending or [commit])[0].version)
        else:
            pending.append(commit)
    return at(pending[0].version if pending else None)
