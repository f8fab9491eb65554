"""The checkpoint configuration's enumerations and bounds."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

#: The default checkpoint interval (Flink's default is off; see :mod:`spark_ckpt.runtime.config`).
DEFAULT_INTERVAL_MS: Final = 1000
#: Smallest checkpoint interval (Flink's ``MINIMAL_CHECKPOINT_TIME``).
MIN_INTERVAL_MS: Final = 10
#: Largest max parallelism (number of key groups), Flink's ``UPPER_BOUND_MAX_PARALLELISM``.
MAX_MAX_PARALLELISM: Final = 32768


class CheckpointingMode(StrEnum):
    """Consistency guarantee of checkpoints. ``AT_LEAST_ONCE`` does not block channels during
    alignment (records after a barrier may be processed before the snapshot)."""

    EXACTLY_ONCE = "EXACTLY_ONCE"
    AT_LEAST_ONCE = "AT_LEAST_ONCE"


class ExternalizedCheckpointRetention(StrEnum):
    """What happens to retained checkpoints when the job is cancelled."""

    NO_EXTERNALIZED_CHECKPOINTS = "NO_EXTERNALIZED_CHECKPOINTS"
    DELETE_ON_CANCELLATION = "DELETE_ON_CANCELLATION"
    RETAIN_ON_CANCELLATION = "RETAIN_ON_CANCELLATION"
