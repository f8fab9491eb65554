"""The project's exception hierarchy.

Every error raised on purpose by spark-ckpt derives from :class:`SparkCkptError`. Errors
from Py4J, delta-rs or the file system are translated into one of these at the boundary
(the storage and Spark adapters), with the original attached as ``__cause__``.
"""

from __future__ import annotations


class SparkCkptError(Exception):
    """Root of every error spark-ckpt raises."""


class ConfigError(SparkCkptError, ValueError):
    """An option has an invalid value. The message names the option, the value and the
    accepted forms."""

    def __init__(self, option: str, value: object, accepted: str) -> None:
        self.option = option
        self.value = value
        self.accepted = accepted
        super().__init__(f"invalid value {value!r} for option {option!r}: expected {accepted}")


class EnvironmentSetupError(SparkCkptError):
    """The machine lacks something spark-ckpt needs (for example Java 17+ for Spark)."""


class CheckpointError(SparkCkptError):
    """A checkpoint could not be triggered, acknowledged or completed."""


class CheckpointFailedError(CheckpointError):
    """The checkpoint, savepoint or final checkpoint of a stop that a client requested
    failed (declined by a task, expired, aborted); the message names the reason. The
    pipeline goes on running, as Flink's does after a failed stop-with-savepoint."""


class TolerableFailuresExceededError(CheckpointError):
    """More consecutive checkpoint failures than ``tolerable_failed_checkpoints``: the job
    must fail. The message carries the reason of the last failure."""


class CoordinatorShutdownError(CheckpointError):
    """The coordinator was shut down; nothing can be triggered any more."""


class StoreError(SparkCkptError):
    """The checkpoint store could not be read or written."""


class CorruptCheckpointError(StoreError):
    """Checkpoint data failed verification (checksum, missing rows, wrong schema). It is
    reported, never loaded.

    ``checkpoint_id``: the completed checkpoint found damaged, when the error is about one
    (:meth:`~spark_ckpt.storage.checkpoint_store.CheckpointStore.verify` and the listing of damaged
    metadata always set it); ``None`` when the error concerns data not attributed to a checkpoint
    (for example one blob read on its own)."""

    def __init__(self, message: str, *, checkpoint_id: int | None = None) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id

    def __reduce__(self) -> tuple[object, ...]:
        # keyword-only state survives pickling (Exception's default would drop it)
        return (_rebuild_corrupt, (type(self), str(self), self.checkpoint_id))


def _rebuild_corrupt(
    cls: type[CorruptCheckpointError], message: str, checkpoint_id: int | None
) -> CorruptCheckpointError:
    return cls(message, checkpoint_id=checkpoint_id)


class FencedError(StoreError):
    """Another coordinator took over the pipeline: this coordinator may no longer commit."""


class CheckpointNotFoundError(StoreError, LookupError):
    """No completed checkpoint (or savepoint) with the requested id or path."""


class StateError(SparkCkptError):
    """Misuse of the state backend: unknown state, wrong type, access outside a key, or a
    snapshot that does not fit the operator it is restored into."""


class StateBackendError(StateError):
    """The state backend's storage failed where the subtask runs: a local directory that is
    not writable, a full disk, a damaged local store. Fails the batch (and the checkpoint in
    progress), never committed output."""


class RestoreError(SparkCkptError):
    """A checkpoint or savepoint cannot be restored into this pipeline as it is now: state
    of an operator uid no operator claims (without allow-non-restored-state), a changed
    source channel count or max parallelism, a savepoint of another pipeline (without
    force), a restore source that does not exist. Raised before any run starts; never
    retried. The message names what differs."""


class SourceError(SparkCkptError):
    """A source cannot deliver what a micro-batch planned: its system is unreachable within
    the configured time, or the records are gone or malformed. The message names the source,
    the partition or file, and the positions. The run fails and restarts per the restart
    strategy; the positions stay where the last completed checkpoint put them."""


class DataLossError(SourceError):
    """Records a source has to read were deleted first (Kafka retention or compaction
    before they were read), and the source fails on data loss (``failOnDataLoss``)."""


class ProtocolError(SparkCkptError):
    """A message broke the checkpoint protocol (for example a barrier on an unknown channel or
    a record that does not match the channel's schema)."""


class PipelineFailedError(SparkCkptError):
    """A streaming query failed and the restart strategy allows no further restart. The
    message carries the strategy's reason and the query's error."""


class PipelineFencedError(PipelineFailedError):
    """The pipeline cannot go on in this driver whatever the restart strategy says: another
    driver's coordinator took the pipeline root over (its lease fences this one), or no
    retained checkpoint can be restored. Never restarted."""
