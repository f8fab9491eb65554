"""Where a pipeline restores from, and whether a checkpoint fits the pipeline as it is now.

:class:`RestoreSettings` (Flink's ``SavepointRestoreSettings``) names one restore source:

* a **savepoint** directory (self-contained, see :mod:`spark_ckpt.delta.savepoint`);
* a **retained checkpoint** by id, of this pipeline's root or of another root (a path);
* the checkpoint that was the latest completed one **as of a time** (UTC), from the
  completion times the checkpoint log and the statistics history record
  (:func:`~spark_ckpt.delta.savepoint.checkpoint_as_of`);
* nothing (the default): the latest completed checkpoint of the root, as every restart does.

:func:`check_restorable` holds the rules a restore keeps (checked in the driver before the
first run starts, for every restore source, the default included):

* state is matched by operator uid, wherever the operator stands in the chain: operators
  may be added, removed or reordered. State of a uid that no operator of the pipeline
  claims is refused, naming the uid, unless ``allow_non_restored_state`` (then it is
  dropped); an operator without state in the checkpoint starts empty. The tasks' own state
  (in-flight channel state, the sink's transactions) belongs to the pipeline's one task
  vertex and its output, not to an operator: it is always restored, and never named;
* a source's channel count must be the same as at the checkpoint (each channel resumes at
  its own position);
* the max parallelism (number of key groups) must be the same; another *parallelism* is
  fine (key groups are redistributed). Changing max parallelism is an offline operation
  (:class:`~spark_ckpt.offline.SavepointWriter`);
* a savepoint taken by another pipeline (its ``pipeline`` property) is refused unless
  ``force``.

The rules read only the checkpoint's metadata (and, for the max parallelism, the metadata of
one keyed blob per operator, supplied by the caller), so they are pure and cheap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from spark_ckpt.errors import ConfigError, RestoreError
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint, is_task_state_uid

#: Properties every savepoint carries (and checkpoints taken by a pipeline, where known).
PIPELINE = "pipeline"
MAX_PARALLELISM = "max_parallelism"
#: Set on a checkpoint a restore created: where its state came from.
RESTORED_FROM = "restored_from"

#: Set on a checkpoint a restore created: the id of the checkpoint whose output the restored
#: state matches. The sink rolls its output back to it (not to the new id) on restore.
OUTPUT_AS_OF = "output_as_of"


def output_checkpoint(checkpoint: CompletedCheckpoint) -> int:
    """The checkpoint id the sink output of a restore of *checkpoint* must be rolled back to."""
    return int(checkpoint.properties.get(OUTPUT_AS_OF, checkpoint.checkpoint_id))


class RestoreKind(StrEnum):
    LATEST = "latest"
    SAVEPOINT = "savepoint"
    CHECKPOINT = "checkpoint"
    AS_OF = "as-of"


@dataclass(frozen=True)
class RestoreSettings:
    """One restore source and the two escape hatches. Build it with :meth:`latest`,
    :meth:`savepoint`, :meth:`checkpoint` or :meth:`as_of`.

    ``path``: the savepoint directory (SAVEPOINT) or the other pipeline root (CHECKPOINT,
    AS_OF; None = this pipeline's root). ``checkpoint_id``: CHECKPOINT only. ``time``: AS_OF
    only, timezone-aware. ``allow_non_restored_state``: drop the state of uids no operator
    claims instead of refusing. ``force``: accept a savepoint of another pipeline."""

    kind: RestoreKind = RestoreKind.LATEST
    path: str | None = None
    checkpoint_id: int | None = None
    time: datetime | None = None
    allow_non_restored_state: bool = False
    force: bool = False

    @staticmethod
    def latest(*, allow_non_restored_state: bool = False) -> RestoreSettings:
        """The latest completed checkpoint of the root (the default)."""
        return RestoreSettings(allow_non_restored_state=allow_non_restored_state)

    @staticmethod
    def savepoint(
        path: str, *, allow_non_restored_state: bool = False, force: bool = False
    ) -> RestoreSettings:
        """The savepoint in directory *path* (copied into the root; never modified)."""
        if not path:
            raise ConfigError("restore savepoint", path, "a savepoint directory")
        return RestoreSettings(
            RestoreKind.SAVEPOINT, path, None, None, allow_non_restored_state, force
        )

    @staticmethod
    def checkpoint(
        checkpoint_id: int, root: str | None = None, *, allow_non_restored_state: bool = False
    ) -> RestoreSettings:
        """Retained checkpoint *checkpoint_id* of *root* (default: this pipeline's root)."""
        if (
            isinstance(checkpoint_id, bool)
            or not isinstance(checkpoint_id, int)
            or checkpoint_id < 1
        ):
            raise ConfigError("restore checkpoint", checkpoint_id, "a checkpoint id >= 1")
        return RestoreSettings(
            RestoreKind.CHECKPOINT, root, checkpoint_id, None, allow_non_restored_state
        )

    @staticmethod
    def as_of(
        time: datetime, root: str | None = None, *, allow_non_restored_state: bool = False
    ) -> RestoreSettings:
        """The latest checkpoint completed at or before *time* (naive times are UTC)."""
        if not isinstance(time, datetime):
            raise ConfigError("restore as-of", time, "a datetime")
        aware = time if time.tzinfo is not None else time.replace(tzinfo=UTC)
        return RestoreSettings(RestoreKind.AS_OF, root, None, aware, allow_non_restored_state)

    def describe(self) -> str:
        """How messages and the ``restored_from`` property name this source."""
        if self.kind is RestoreKind.SAVEPOINT:
            return f"savepoint {self.path}"
        where = f" of {self.path}" if self.path else ""
        if self.kind is RestoreKind.CHECKPOINT:
            return f"checkpoint {self.checkpoint_id}{where}"
        if self.kind is RestoreKind.AS_OF:
            assert self.time is not None
            return f"the latest checkpoint{where} as of {self.time.isoformat()}"
        return "the latest checkpoint"


def parse_time(text: str) -> datetime:
    """An ISO-8601 time (``2026-11-23T10:00:00``, ``…Z``, ``…+01:00``; naive = UTC) or
    epoch milliseconds; :class:`ConfigError` otherwise."""
    value = text.strip()
    if value.isdigit():
        return datetime.fromtimestamp(int(value) / 1000, tz=UTC)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as e:
        raise ConfigError("time", text, "an ISO-8601 time or epoch milliseconds") from e
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class PipelineShape:
    """What a restore is checked against: the pipeline's name, the operator uids of its
    chain (in order), the channel count of each source, and the max parallelism."""

    pipeline: str
    operator_uids: tuple[str, ...]
    channels: Mapping[str, int]
    max_parallelism: int
    #: the names of the pipeline's inputs (several named inputs; empty: one source)
    inputs: tuple[str, ...] = ()
    #: operators whose stage has a max parallelism of its own (several stages): uid → it
    operator_max_parallelism: tuple[tuple[str, int], ...] = ()

    def max_parallelism_of(self, uid: str) -> int:
        """The max parallelism of operator *uid*'s stage."""
        return dict(self.operator_max_parallelism).get(uid, self.max_parallelism)


def state_uids(checkpoint: CompletedCheckpoint) -> set[str]:
    """Uids of the operators that hold state in *checkpoint* (keyed or operator state; the
    tasks' own state is not an operator's)."""
    return {b.operator_uid for b in checkpoint.blobs() if not is_task_state_uid(b.operator_uid)}


def channel_counts(checkpoint: CompletedCheckpoint) -> dict[str, int]:
    """Source → number of channels with a position in *checkpoint*."""
    counts: dict[str, set[int]] = {}
    for source, channel in checkpoint.offsets():
        counts.setdefault(source, set()).add(channel)
    return {s: len(c) for s, c in counts.items()}


def check_restorable(
    checkpoint: CompletedCheckpoint,
    shape: PipelineShape,
    settings: RestoreSettings,
    *,
    stored_max_parallelism: Iterable[tuple[str, int]] = (),
) -> list[str]:
    """Check the rules of the module docstring; returns the uids whose state will be
    dropped (allowed non-restored state). Raises :class:`RestoreError` naming the first
    rule broken. *stored_max_parallelism*: (uid, max parallelism) as recorded in the keyed
    blobs of the checkpoint."""
    what = f"checkpoint {checkpoint.checkpoint_id}"
    if checkpoint.is_savepoint:
        what = f"savepoint {checkpoint.checkpoint_id}"
    owner = checkpoint.properties.get(PIPELINE)
    if (
        settings.kind is RestoreKind.SAVEPOINT
        and owner is not None
        and owner != shape.pipeline
        and not settings.force
    ):
        raise RestoreError(
            f"{what} at {settings.path} belongs to pipeline {owner!r}, not {shape.pipeline!r} "
            "(restore it with force to adopt it)"
        )
    _check_inputs(checkpoint, shape, settings, what)
    before = channel_counts(checkpoint)
    for source, count in sorted(shape.channels.items()):
        old = before.get(source)
        if old is not None and old != count:
            raise RestoreError(
                f"source {source!r} had {old} channels at {what}, the pipeline now has {count}: "
                "a changed channel count cannot be restored (each channel resumes at its own "
                "position)"
            )
    for uid, stored in stored_max_parallelism:
        if stored != shape.max_parallelism_of(uid):
            raise RestoreError(
                f"operator {uid!r} was checkpointed with max parallelism {stored} at {what}, "
                f"the pipeline now has {shape.max_parallelism_of(uid)}: change it offline "
                "(SavepointWriter.with_max_parallelism) or keep it"
            )
    unclaimed = sorted(state_uids(checkpoint) - set(shape.operator_uids))
    if unclaimed and not settings.allow_non_restored_state:
        raise RestoreError(
            f"{what} has state of operator uid {unclaimed[0]!r}"
            + (f" (and {', '.join(repr(u) for u in unclaimed[1:])})" if unclaimed[1:] else "")
            + " that no operator of the pipeline claims: restore with "
            "allow_non_restored_state to drop it"
        )
    return unclaimed


def checkpoint_inputs(checkpoint: CompletedCheckpoint) -> list[str] | None:
    """The names of the inputs whose channels *checkpoint* holds (channels named
    ``<input>/<channel>``), in channel order; None for a checkpoint of a pipeline with one
    source."""
    import json

    from spark_ckpt.sources.kafka_options import CHANNEL_NAMES

    recorded = checkpoint.properties.get(CHANNEL_NAMES)
    if recorded is None:
        return None
    try:
        names = [str(n) for n in json.loads(recorded)]
    except (TypeError, ValueError) as e:
        raise RestoreError(f"checkpoint {checkpoint.checkpoint_id}: damaged channel names") from e
    if not names or not all("/" in n for n in names):
        return None
    return list(dict.fromkeys(n.split("/", 1)[0] for n in names))


def _check_inputs(
    checkpoint: CompletedCheckpoint, shape: PipelineShape, settings: RestoreSettings, what: str
) -> None:
    """Inputs by name (``docs/upgrades.md``): an input the checkpoint does not know starts from
    its own start; one it holds that the pipeline no longer reads is refused unless
    ``allow_non_restored_state``. A checkpoint of one source does not restore into a pipeline
    of named inputs, nor the reverse: channels are not matched across the two."""
    before = checkpoint_inputs(checkpoint)
    if not shape.inputs:
        if before is not None:
            raise RestoreError(
                f"{what} holds the channels of the named inputs {before}: it restores into a "
                "pipeline with those inputs (sources={...}), not into one with a single source"
            )
        return
    if before is None:
        if checkpoint.offsets():
            raise RestoreError(
                f"{what} was taken by a pipeline with a single source: its channels do not "
                f"restore into the named inputs {list(shape.inputs)} (not supported yet)"
            )
        return
    removed = [n for n in before if n not in shape.inputs]
    if removed and not settings.allow_non_restored_state:
        raise RestoreError(
            f"{what} holds the positions of input {removed[0]!r}, which the pipeline no longer "
            "reads: restore with allow_non_restored_state to drop them"
        )


def without_uids(checkpoint: CompletedCheckpoint, uids: Iterable[str]) -> CompletedCheckpoint:
    """*checkpoint* without the blobs of *uids* (allowed non-restored state)."""
    from dataclasses import replace

    drop = set(uids)
    if not drop:
        return checkpoint
    tasks = tuple(
        replace(t, blobs=tuple(b for b in t.blobs if b.operator_uid not in drop))
        for t in checkpoint.tasks
    )
    return replace(checkpoint, tasks=tasks)
