"""What a subtask's changelog changed since its last full image, per operator state backend:
the bookkeeping that lets a subtask on the executors fold its changelog and build its next
checkpoint on one that another process snapshotted (a rebase).

Every image a task exports or applies (:mod:`spark_ckpt.runtime.subtask_image`) ends a
*segment* of its changelog: what each keyed state recorded since the previous one (the
``segment`` changes of :class:`~spark_ckpt.state.snapshot.changes.TrackedState`, kept apart
from the changes since the last snapshot). :class:`ImageHistory` keeps a backend's segments
since the last full image, each tagged with the newest snapshot taken by the end of its
micro-batch; it is the :class:`~spark_ckpt.state.snapshot.strategy.ChangeHistory` a rebase
reads (:meth:`~spark_ckpt.runtime.task.OperatorTask.rebase`). The functions below build a
segment's blobs (:func:`changed_blobs`, :func:`folded_blobs`) or note one applied
(:func:`segment_done`), each starting the next segment, and start a history at a full
image (:func:`full_image_taken`) or from a loaded chain (:meth:`ImageHistory.loaded`). A
backend has no history (None) until then: after a restore, or in a task built fresh. A
segment's keyed blobs cost O(keys changed in it; for a fold, since the full image); operator
state is always whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa

from spark_ckpt.protocol.state_handles import StateBlob
from spark_ckpt.state.backend import KeyedStateBackend
from spark_ckpt.state.snapshot.chain_rules import MAX_DELTA_ROWS_RATIO
from spark_ckpt.state.snapshot.changes import LOG_COLUMNS, StateChanges, start_segment


class ImageHistory:
    """What the changelog's segments changed since its last full image, segment by segment,
    each tagged with the newest snapshot taken by the end of its micro-batch (subtasks on
    the executors, :mod:`spark_ckpt.runtime.subtask_image`). It answers two questions: what
    changed since the full image (a fold of the changelog), and what changed since
    checkpoint *C* (a rebase onto *C*). Because the source aligns, a micro-batch's snapshot
    is taken after all of its data rows: the changes of the segment in which *C* was
    snapshotted precede *C*, those of every later segment follow it."""

    def __init__(self, image_tag: int, rebase_from: int) -> None:
        #: the newest snapshot taken by the full image's micro-batch
        self.image_tag = image_tag
        #: the oldest checkpoint whose snapshot holds everything the full image holds
        self.rebase_from = rebase_from
        # (tag, whether a fold, changes by state name), oldest first
        self._segments: list[tuple[int, bool, dict[str, StateChanges]]] = []

    @classmethod
    def loaded(
        cls,
        image_tag: int,
        rebase_from: int,
        segments: Sequence[tuple[int, bool, Mapping[str, Sequence[pa.Table]]]],
    ) -> ImageHistory:
        """The history of a state just loaded from a changelog chain: a full image taken
        after snapshot *image_tag*, whose state checkpoint *rebase_from* and later ones hold
        (what :func:`full_image_taken` found), then delta images, each with its tag, whether
        it is a fold, and its keyed DELTA tables by state name (*segments*, oldest first):
        what the chain's segments changed is known, so folds and rebases work from here."""
        history = cls(image_tag, rebase_from)
        for tag, folds, deltas in segments:
            changes: dict[str, StateChanges] = {}
            for name, tables in deltas.items():
                c = changes[name] = StateChanges()
                for table in tables:
                    log = table.select(list(LOG_COLUMNS))  # as the log holds it: nullable
                    c.append_table(pa.table(log.columns, names=list(LOG_COLUMNS)), 0)
            history.add(tag, changes, folds=folds)
        return history

    def add(self, tag: int, changes: Mapping[str, StateChanges], *, folds: bool = False) -> None:
        """A segment after the previous ones, its micro-batch's newest snapshot *tag*;
        *folds*: it holds every change since the full image (a fold), and replaces them."""
        if folds:
            self._segments = []
        kept = {name: c.compacted() if folds else c for name, c in changes.items() if c}
        self._segments.append((tag, folds, kept))

    def since_image(self) -> dict[str, StateChanges]:
        """Per state, every change since the full image."""
        return self._union(self._segments)

    def since(self, checkpoint_id: int) -> dict[str, StateChanges] | None:
        """Per state, a superset of the changes since checkpoint *checkpoint_id*'s snapshot,
        or None when they are not known here (it was taken before the full image, or after
        the last segment)."""
        if checkpoint_id < self.rebase_from:
            return None
        if self.image_tag >= checkpoint_id:  # taken in the full image's micro-batch
            return self._union(self._segments)
        for i, (tag, folds, _) in enumerate(self._segments):
            if tag >= checkpoint_id:  # the segment in which it was taken
                # a fold also holds the changes of the segments it replaced, some of which
                # may follow the snapshot: it stays in
                return self._union(self._segments[i if folds else i + 1 :])
        return None

    @staticmethod
    def _union(
        segments: Sequence[tuple[int, bool, dict[str, StateChanges]]],
    ) -> dict[str, StateChanges]:
        out: dict[str, StateChanges] = {}
        for _, _, changes in segments:
            for name, c in changes.items():
                earlier = out.get(name)
                out[name] = c if earlier is None else earlier.then(c)
        return {name: StateChanges().then(c).compacted() for name, c in out.items()}


def full_image_taken(backend: KeyedStateBackend, last_snapshot_id: int) -> ImageHistory:
    """The whole state of *backend* was just exported as a full image of the changelog,
    after snapshot *last_snapshot_id*: the next segment starts here, and so do folds — the
    returned history, empty, is where the following segments go. Its ``rebase_from`` is
    the oldest checkpoint whose snapshot holds the image's state: *last_snapshot_id* if
    the backend's strategy took it and nothing changed since, else the next one."""
    unchanged = backend.snapshots.unchanged_since(last_snapshot_id)
    start_segment(backend.tables)
    return ImageHistory(last_snapshot_id, last_snapshot_id if unchanged else last_snapshot_id + 1)


def changed_blobs(
    backend: KeyedStateBackend, history: ImageHistory | None, tag: int
) -> list[StateBlob]:
    """What changed in *backend* since the previous changelog segment (or the restore),
    whatever snapshots were taken meanwhile: a DELTA blob per keyed state that changed
    (``seq`` 1: the caller orders a chain) and an OPERATOR blob per operator state (always
    whole). A subtask's changelog segment, whose micro-batch's newest snapshot is *tag*:
    it goes into *history*, and the next segment starts (the snapshot history is not
    touched)."""
    tables = backend.tables
    blobs = [
        backend.snapshots.delta_blob(name, tables[name].segment)
        for name in sorted(tables)
        if tables[name].segment
    ]
    segment_done(backend, history, tag)
    return blobs + backend.snapshots.operator_blobs()


def folded_blobs(
    backend: KeyedStateBackend, history: ImageHistory | None, tag: int
) -> list[StateBlob] | None:
    """What changed in *backend* since the changelog's last full image, as
    :func:`changed_blobs` gives it for one segment: the changelog's delta segments since
    that image folded into one (the current value of every key changed since, or its
    tombstone), so the changelog can drop them; it replaces them in *history*, and the next
    segment starts. None, and nothing touched, when what those segments hold is not known
    (no *history*: the state was loaded since the last full image) or a folded delta would
    exceed :data:`~spark_ckpt.state.snapshot.chain_rules.MAX_DELTA_ROWS_RATIO` times its
    state's keys: export a full image then."""
    if history is None:
        return None
    tables = backend.tables
    earlier = history.since_image()
    folded: dict[str, StateChanges] = {}
    blobs: list[StateBlob] = []
    for name in sorted(tables):
        state = tables[name]
        before = earlier.get(name)
        since = state.segment if before is None else before.then(state.segment)
        if not since:
            continue
        blob = backend.snapshots.delta_blob(name, since)
        if blob.table.num_rows > MAX_DELTA_ROWS_RATIO * state.count():
            return None
        folded[name] = since
        blobs.append(blob)
    history.add(tag, folded, folds=True)
    start_segment(tables)
    return blobs + backend.snapshots.operator_blobs()


def segment_done(
    backend: KeyedStateBackend, history: ImageHistory | None, tag: int, *, folds: bool = False
) -> None:
    """*backend*'s keyed states' changes since the previous segment form a segment of the
    changelog, whose micro-batch's newest snapshot is *tag* (a segment this task published,
    or one another process published and this task just applied; *folds*: one that holds
    every change since the full image): it goes into *history*, and the next segment
    starts."""
    if history is not None:
        changes = {name: state.segment for name, state in backend.tables.items()}
        history.add(tag, changes, folds=folds)
    start_segment(backend.tables)
