"""The workload and the sizes of a run: :class:`Settings` (:data:`FULL`, :data:`QUICK`), the two
configurations compared (:data:`CONFIGS`) and the ``ckpt-source`` options of a query."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from spark_ckpt.runtime.config import CheckpointConfig

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "results" / "pipeline.json"

#: The two configurations compared: checkpoints every ``interval_ms``, and none at all.
CONFIGS = ("checkpoints", "off")


@dataclass(frozen=True)
class Settings:
    """Sizes of one benchmark run."""

    channels: int
    keys: int
    parallelism: int
    interval_ms: int  # checkpoint interval of the checkpointing configuration
    calibration_rows: int  # maxRowsPerTrigger of the calibration (and warm-up) query
    calibration_batches: int  # its batches; capacity = rows per busy second after the first
    utilization: float  # offered input rate as a fraction of the calibrated capacity
    rate: float  # throughput queries: rows/s of all channels (set from the calibration)
    trigger_s: float  # throughput queries: processing-time trigger (identical batches)
    warmup_batches: int  # batches with data not measured (the first is Spark's warm-up)
    measured_batches: int  # batches with data measured per query
    reps: int  # throughput: repetitions (each runs both configurations)
    latency_reps: int  # checkpoint duration: queries with the default trigger
    latency_rate: float  # their input rate (rows/s, all channels; set from the calibration)
    lag_batch_rows: int  # maxRowsPerTrigger of the lag queries
    lags: tuple[int, ...]  # channel 0 delivers the barrier this many batches late
    lag_warmup: int  # lag: the checkpoint is requested after this many batches
    lag_rate: float  # lag: rows/s per channel
    lag_reps: int  # lag: repetitions of every (mode, lag) case
    sustained_rate: float  # sustained: rows/s offered (all channels), no read limit
    sustained_warmup: int  # sustained: batches before the measured window
    sustained_measured: int  # sustained: batches processed in the measured window
    sustained_reps: int  # sustained/saturated: repetitions (each runs both configurations)
    saturated_batch_rows: int  # saturated: maxRowsPerTrigger over a backlog (same window)
    pipelined_warmup_batches: int  # sustained/saturated: batches of an unmeasured first query
    query_timeout_s: float

    @property
    def batch_rows(self) -> int:
        """Rows of one throughput micro-batch (all channels): one trigger period's input."""
        return int(self.rate * self.trigger_s)

    @property
    def max_rows_per_trigger(self) -> int:
        """Read limit of the throughput/latency queries: two periods' input, so that the
        rows produced during the slow first batch are absorbed over the warm-up batches."""
        return 2 * self.batch_rows


FULL = Settings(
    channels=4,
    keys=100_000,
    parallelism=2,
    interval_ms=1000,
    calibration_rows=400_000,
    calibration_batches=4,
    utilization=0.5,
    rate=200_000.0,
    trigger_s=2.0,
    warmup_batches=3,
    measured_batches=6,
    reps=3,
    latency_reps=2,
    latency_rate=100_000.0,
    lag_batch_rows=100_000,
    lags=(3, 10, 30),
    lag_warmup=2,
    lag_rate=500.0,
    lag_reps=2,
    sustained_rate=1_200_000.0,
    sustained_warmup=3,
    sustained_measured=12,
    sustained_reps=4,
    saturated_batch_rows=600_000,
    pipelined_warmup_batches=30,
    query_timeout_s=180.0,
)
QUICK = replace(
    FULL,
    calibration_rows=200_000,
    calibration_batches=3,
    trigger_s=1.5,
    warmup_batches=2,
    measured_batches=2,
    reps=1,
    latency_reps=1,
    lags=(3,),
    lag_reps=1,
    sustained_rate=600_000.0,
    sustained_warmup=2,
    sustained_measured=3,
    sustained_reps=1,
    saturated_batch_rows=300_000,
    pipelined_warmup_batches=4,
    query_timeout_s=60.0,
)


def checkpoint_config(s: Settings, name: str) -> CheckpointConfig:
    """The configuration *name* (one of :data:`CONFIGS`)."""
    if name == "checkpoints":
        return CheckpointConfig(interval_ms=s.interval_ms, retained_checkpoints=2)
    return CheckpointConfig(interval_ms=None)


def source_options(
    s: Settings, backlog: Sequence[int], rate_per_channel: float, max_rows: int | None
) -> dict[str, object]:
    """``ckpt-source`` options of the generator: *backlog* rows per channel to start with,
    then *rate_per_channel* rows/s each, read at most *max_rows* per micro-batch."""
    options: dict[str, object] = {
        "source": "generator",
        "channels": s.channels,
        "rate": rate_per_channel,
        "backlog": ",".join(str(b) for b in backlog),
        "keys": s.keys,
        "seed": 7,
    }
    if max_rows is not None:
        options["maxRowsPerTrigger"] = max_rows
    return options
