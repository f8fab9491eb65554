"""The main job: generator (or a Delta table, Kafka, files landing in a directory) → keyed
running count (keyed state) → Delta, exactly-once. With ``--window SIZE`` the operator is an
event-time tumbling window (count and sum of the generator's rows per user and window, on
its ``event_ts``, ``--out-of-orderness`` behind); with ``--follow-up DELAY`` a row per user
DELAY of processing time after the micro-batch it first appears in (processing-time timers).
With ``--job join`` it reads two generated inputs, ``clicks`` and ``impressions`` (seeds
``--seed`` and ``--seed + 1``), and joins each click with the impressions of its user within
``--join-interval`` either side of it on ``event_ts`` (an interval join, each input's
watermark ``--out-of-orderness`` behind).

Runs on the embedded default: local Spark (``local[2]``) and a Delta checkpoint store in a
local folder. Prints a legend, then one line per completed checkpoint (id, duration, state
bytes, alignment time, rows committed, input rows/s and lag, see :data:`LEGEND`), and none of
Spark's console noise unless ``--spark-logs``; stops after ``--seconds`` or on Ctrl-C
("stopping..." at once) with a final checkpoint, or —
with ``--available-now`` — once the available input is processed, ending with a final
checkpoint. A second run resumes from the last checkpoint.

    python -m spark_ckpt.demo --seconds 60
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt.errors import ConfigError, SparkCkptError
from spark_ckpt.locations.uris import normalized, sibling
from spark_ckpt.pipeline.job import Placement
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.config.durations import parse_duration
from spark_ckpt.runtime.event_time import WatermarkStrategy
from spark_ckpt.runtime.operator import KeyedOperator, RunningCount, rank_within_key
from spark_ckpt.runtime.restore_settings import RestoreSettings, parse_time
from spark_ckpt.runtime.stage import Stage
from spark_ckpt.runtime.windows import Agg, WindowAggregate, Windows
from spark_ckpt.sources.stream_offset import BarrierPlacement
from spark_ckpt.state.context import StateContext
from spark_ckpt.state.descriptor import ValueStateDescriptor

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

MODES = ("aligned", "unaligned", "at-least-once", "aligned-timeout")


def build_config(args: argparse.Namespace) -> CheckpointConfig:
    options = {
        "checkpoint.interval": args.interval,
        "checkpoint.mode": "at_least_once" if args.mode == "at-least-once" else "exactly_once",
        "checkpoint.unaligned": str(args.mode in ("unaligned", "aligned-timeout")).lower(),
        "checkpoint.aligned-timeout": args.aligned_timeout
        if args.mode == "aligned-timeout"
        else "0",
        "checkpoint.externalized-retention": args.retention,
        "checkpoint.retained": str(args.retained),
        "checkpoint.tolerable-failures": str(args.tolerable_failures),
        "restart-strategy": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": str(args.restarts),
        "restart-strategy.fixed-delay.delay": args.restart_delay,
    }
    if args.savepoint_dir:
        options["savepoint.dir"] = normalized(args.savepoint_dir)
    options["state.backend.type"] = args.state_backend
    return CheckpointConfig.from_options(options)


def restore_settings(args: argparse.Namespace) -> RestoreSettings:
    """The ``--restore-*`` options as :class:`RestoreSettings` (ConfigError if bad)."""
    allow = bool(args.allow_non_restored_state)
    if args.restore_savepoint:
        return RestoreSettings.savepoint(
            normalized(args.restore_savepoint),
            allow_non_restored_state=allow,
            force=args.force,
        )
    root = normalized(args.restore_root) if args.restore_root else None
    if args.restore_checkpoint is not None:
        return RestoreSettings.checkpoint(
            args.restore_checkpoint, root, allow_non_restored_state=allow
        )
    if args.restore_as_of:
        return RestoreSettings.as_of(
            parse_time(args.restore_as_of), root, allow_non_restored_state=allow
        )
    return RestoreSettings.latest(allow_non_restored_state=allow)


#: What the checkpoint lines say, printed once at the start.
LEGEND = """\
one line per completed checkpoint:
  id         checkpoint id, increasing; each run (a start, a restart) leases a new block
             of 1000 ids in the store, so ids jump at a new run (24 -> 1001 -> 2001)
  type       checkpoint or savepoint
  dur ms     from trigger to completion
  state KiB  state size; written KiB: what this checkpoint wrote (incremental)
  align ms   longest barrier alignment of a task
  committed  rows in the output table
  rows/s     input rows per second since the previous line (from source positions)
  lag        input rows available at the source but past the checkpoint's positions
             (as of the newest micro-batch), and seconds of input at the source's rate"""

#: The column header of the checkpoint lines.
HEADER = (
    f"{'id':>6} {'type':<10} {'dur ms':>7} {'state KiB':>10} {'written KiB':>11} "
    f"{'align ms':>8} {'committed':>11} {'rows/s':>9} {'lag rows':>9} {'lag s':>6}"
)


class CheckpointLine:
    """Formats one completed checkpoint's line (see :data:`LEGEND`). *heads* gives the
    source channels' heads (None: unknown); *rate* is the source's production rate in rows
    per second (None: unknown)."""

    def __init__(self, heads: Callable[[], list[int] | None], rate: float | None) -> None:
        self.heads = heads
        self.rate = rate
        self.previous: CompletedCheckpoint | None = None
        self.last_heads: list[int] | None = None  # the query may have ended meanwhile

    def format(self, cp: CompletedCheckpoint, committed: int) -> str:
        s = cp.stats
        position = sum(cp.offsets().values())
        throughput = "-"
        prev = self.previous
        if prev is not None and s.trigger_ms > prev.stats.trigger_ms:
            rows = position - sum(prev.offsets().values())
            throughput = f"{rows * 1000 / (s.trigger_ms - prev.stats.trigger_ms):.0f}"
        self.previous = cp
        heads = self.heads() or self.last_heads
        self.last_heads = heads
        lag_rows = lag_s = "-"
        if heads is not None:
            lag = max(0, sum(heads) - position)
            lag_rows = str(lag)
            if self.rate:
                lag_s = f"{lag / self.rate:.1f}"
        return (
            f"{cp.checkpoint_id:>6} {cp.snapshot_type.value:<10} {s.end_to_end_ms:>7} "
            f"{s.state_bytes / 1024:>10.1f} {s.bytes_written / 1024:>11.1f} "
            f"{s.max_alignment_ms:>8} {committed:>11} {throughput:>9} {lag_rows:>9} {lag_s:>6}"
        )


def source_heads(spark: SparkSession, pipeline: str) -> list[int] | None:
    """The source channels' heads as the newest micro-batch of *pipeline*'s running query saw
    them (the source's ``latestOffset`` in the query's progress); None when unknown."""
    try:
        for query in spark.streams.active:
            if not (query.name or "").startswith(f"{pipeline}-"):
                continue
            progress = query.lastProgress
            if progress is None:
                return None
            for source in json.loads(progress.json).get("sources", []):
                latest = source.get("latestOffset")
                if isinstance(latest, str):
                    latest = json.loads(latest)
                if isinstance(latest, dict) and "positions" in latest:
                    return [int(p) for p in latest["positions"]]
    except Exception as e:  # a query ending meanwhile: the line shows no lag
        log.debug("reading the query's progress: %s", e)
    return None


def committed_rows(path: str) -> int:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        actions = DeltaTable(path).get_add_actions(flatten=True)
    except TableNotFoundError:
        return 0
    import pyarrow as pa

    return int(pa.table(actions).column("num_records").to_numpy().sum())


def main(argv: Sequence[str] | None = None, *, components: str | None = None) -> int:
    """The demo with the command line *argv*; returns the exit status. *components*: the
    job's ``module:name`` of :class:`~spark_ckpt.runtime.components.Components` (see
    :mod:`spark_ckpt.testing.faulty_job`), None for the pipeline's own."""
    args = parse_args(argv)
    try:
        settings = restore_settings(args)
    except ConfigError as e:
        return fail(str(e), 2)

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from spark_ckpt.spark.session.builders import connect_session, local_session

    app = f"spark-ckpt-{args.pipeline}"
    if args.remote:
        spark = connect_session(args.remote, app, log_level="ERROR", quiet=not args.spark_logs)
    else:
        spark = local_session(
            app,
            master=args.master,
            log_level="ERROR",
            quiet=not args.spark_logs,
            conf=dict(args.conf),
        )
    # The one line goes last, after Spark stopped: stopping a failed query's tasks logs their
    # interrupts, which would otherwise come below it.
    failure: SparkCkptError | None = None
    try:
        return run(spark, args, settings, components)
    except SparkCkptError as e:  # a failed pipeline, a restore refused, a damaged store, ...
        failure = e
    except KeyboardInterrupt:  # a second Ctrl-C while stopping
        pass
    finally:  # whatever happened (other errors end in spark_ckpt.cli.main's one line)
        stop_spark(spark)
    if failure is not None:
        return fail(str(failure), 1)
    print("interrupted", file=sys.stderr, flush=True)
    return 130


def run_in(spark: SparkSession, argv: Sequence[str], components: str | None = None) -> int:
    """The job of the command line *argv* on *spark*, a session the caller started and
    keeps (its ``--master``, ``--remote``, ``--conf`` and ``--spark-logs`` are ignored);
    returns 0 when it stopped as asked. Raises what failed it, as :func:`run`."""
    args = parse_args(argv)
    return run(spark, args, restore_settings(args), components)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The demo's command line (a usage error exits with status 2 and one ``error:`` line)."""
    p = _Parser(prog="spark-ckpt demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--pipeline", default="demo")
    p.add_argument(
        "--root", default=None, help="pipeline root (default ./spark-ckpt-data/<pipeline>)"
    )
    p.add_argument(
        "--output", default=None, help="output Delta table (default <root>/../<pipeline>_counts)"
    )
    p.add_argument(
        "--seconds", type=float, default=60.0, help="stop after this long (0 = until Ctrl-C)"
    )
    p.add_argument(
        "--available-now", action="store_true", help="process what is available, then stop"
    )
    p.add_argument("--mode", choices=MODES, default="aligned")
    p.add_argument("--interval", default="1s")
    p.add_argument("--aligned-timeout", default="200ms")
    p.add_argument("--channels", type=int, default=4)
    p.add_argument("--rate", type=float, default=20_000.0, help="rows/s per channel")
    p.add_argument("--backlog", default="0", help="initial rows per channel (one value or a list)")
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--input",
        default=None,
        help="tail this append-only Delta table (user_id int64 column) instead of the generator",
    )
    p.add_argument(
        "--kafka",
        metavar="SERVERS",
        default=None,
        help="read Kafka at these brokers instead of the generator (a count per record key)",
    )
    p.add_argument(
        "--files",
        metavar="DIR",
        default=None,
        help="read JSON-lines files (user_id long) landing in DIR instead of the generator",
    )
    p.add_argument(
        "--files-archive",
        metavar="DIR",
        default=None,
        help="with --files: archive each file into DIR once a checkpoint covers it",
    )
    p.add_argument(
        "--kafka-json",
        action="store_true",
        help="with --kafka: the values are JSON objects; count per their user_id (parsed with "
        "Spark SQL before the keyed operator) instead of per record key",
    )
    p.add_argument(
        "--subscribe-pattern",
        default=".*",
        help="with --kafka: the topics to read, a regular expression (new ones are discovered)",
    )
    p.add_argument("--max-rows-per-trigger", type=int, default=None)
    p.add_argument(
        "--restarts", type=int, default=3, help="restart attempts after a failure (fixed delay)"
    )
    p.add_argument("--restart-delay", default="1s")
    p.add_argument("--retained", type=int, default=2, help="checkpoints to retain")
    p.add_argument("--tolerable-failures", type=int, default=3)
    p.add_argument(
        "--retention",
        default="RETAIN_ON_CANCELLATION",
        help="externalized checkpoint retention on stop",
    )
    p.add_argument(
        "--barrier-placement",
        choices=[p.value for p in BarrierPlacement],
        default=BarrierPlacement.READ.value,
        help="where barriers go under a read limit: the batch's end, or each channel's head",
    )
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument(
        "--placement",
        choices=[w.value for w in Placement],
        default=Placement.EXECUTORS.value,
        help="where the subtasks run: in the driver (foreachBatch) or on the executors",
    )
    p.add_argument(
        "--master",
        default="local[2]",
        help="classic Spark's master, e.g. local-cluster[2,1,1024] for executors as processes",
    )
    p.add_argument(
        "--conf",
        action="append",
        type=_spark_setting,
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting of the session (repeatable)",
    )
    p.add_argument(
        "--remote",
        default=None,
        metavar="URL",
        help="run under Spark Connect: sc://host:port, or local[2] for a local Connect server",
    )
    p.add_argument("--uid", default="counter", help="uid of the running-count operator")
    time_job = p.add_mutually_exclusive_group()
    time_job.add_argument(
        "--window",
        metavar="SIZE",
        default=None,
        help="instead of the running count: per user, count and sum of amount in event-time "
        "tumbling windows of SIZE (e.g. 2s), each emitted once the watermark passes it",
    )
    time_job.add_argument(
        "--follow-up",
        metavar="DELAY",
        default=None,
        help="instead of the running count: a row per user DELAY (e.g. 500ms) of processing "
        "time after the micro-batch it first appears in",
    )
    p.add_argument(
        "--out-of-orderness",
        default="1s",
        help="with --window or --job join: how far the watermark trails the largest event time",
    )
    p.add_argument(
        "--job",
        choices=("count", "join", "stages"),
        default="count",
        help="count: the keyed running count (or --window, --follow-up); join: an interval "
        "join of two generated inputs, clicks and impressions, by user; stages: per-user "
        "running totals, then re-keyed by country, per-country running counts",
    )
    p.add_argument(
        "--stage-parallelism",
        type=int,
        default=None,
        help="with --job stages: the parallelism of the second stage (default: --parallelism)",
    )
    p.add_argument(
        "--join-interval",
        default="1s",
        help="with --job join: a click joins its user's impressions this far either side of it",
    )
    p.add_argument("--savepoint-dir", default=None, help="default directory of savepoints")
    p.add_argument(
        "--state-backend",
        choices=("hashmap", "rocksdb"),
        default="hashmap",
        help="where the subtasks keep their keyed state (state.backend.type)",
    )
    restore = p.add_argument_group(
        "restore", "where the first run restores from (default: the latest checkpoint)"
    )
    where = restore.add_mutually_exclusive_group()
    where.add_argument("--restore-savepoint", metavar="PATH", help="a savepoint directory")
    where.add_argument(
        "--restore-checkpoint",
        metavar="ID",
        type=int,
        help="a retained checkpoint of the root (or of --restore-root)",
    )
    where.add_argument(
        "--restore-as-of",
        metavar="TIME",
        help="the latest checkpoint completed at or before TIME (ISO-8601, UTC if no zone, "
        "or epoch ms)",
    )
    restore.add_argument("--restore-root", metavar="ROOT", help="another pipeline's root")
    restore.add_argument(
        "--allow-non-restored-state",
        action="store_true",
        help="drop state of operator uids the pipeline no longer has instead of refusing",
    )
    restore.add_argument(
        "--force", action="store_true", help="restore a savepoint of another pipeline"
    )
    p.add_argument("--quiet", action="store_true")
    p.add_argument(
        "--spark-logs",
        action="store_true",
        help="show Spark's own console output (log4j notices, WARN lines, Connect worker lines)",
    )
    return p.parse_args(argv)


def _spark_setting(text: str) -> tuple[str, str]:
    """``--conf KEY=VALUE`` as a pair."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error ending in one ``error: …`` line (exit status 2), as
    :mod:`spark_ckpt.cli`'s (which this layer may not import)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"error: {message}\n")


def fail(message: str, status: int) -> int:
    """Print *message* as the demo's one ``error: …`` line; returns *status*."""
    print("error: " + (" ".join(message.split()) or "failed"), file=sys.stderr, flush=True)
    return status


def stop_spark(spark: SparkSession) -> None:
    """Stop the session; a failure to stop is logged, never raised over the outcome."""
    try:
        spark.stop()
    except Exception as e:
        log.debug("stopping Spark: %s", e)


def parse_user_ids(df: Any) -> Any:
    """``--kafka-json``: Kafka values ``{"user_id": n, ...}`` as a ``user_id`` column."""
    from pyspark.sql import functions as F

    return (
        df.selectExpr("CAST(value AS STRING) AS json")
        .select(F.from_json("json", "user_id LONG").alias("event"))
        .select("event.user_id")
        .where("user_id IS NOT NULL")
    )


class FollowUp(KeyedOperator):
    """A row per key, *delay_ms* of processing time after the micro-batch the key first
    appears in: a processing-time timer per key (``key``, ``due`` in ms since the epoch)."""

    SEEN = ValueStateDescriptor("seen", pa.bool_())

    def __init__(self, uid: str, key_column: str, key_type: pa.DataType, delay_ms: int) -> None:
        super().__init__(uid, key_column, key_type)
        self.delay_ms = delay_ms

    @property
    def output_schema(self) -> pa.Schema:
        return pa.schema([pa.field(self.key_column, self.key_type), pa.field("due", pa.int64())])

    def open(self, state: StateContext) -> None:
        state.value_state(self.SEEN)

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        keys = pc.unique(batch.column(self.key_column))
        new = keys.filter(pc.is_null(state.get_values(self.SEEN, keys)))
        due = pa.array([state.current_processing_time + self.delay_ms] * len(new), pa.int64())
        state.register_processing_time_timers(new, due)
        state.put_values(self.SEEN, new, pa.array([True] * len(new)))
        return None

    def on_timers(self, timers: pa.Table, state: StateContext) -> pa.Table | None:
        return pa.table(
            [timers.column(self.key_column).cast(self.key_type), timers.column("timestamp")],
            schema=self.output_schema,
        )


def job_operator(
    args: argparse.Namespace, key: str, key_type: pa.DataType
) -> tuple[KeyedOperator, WatermarkStrategy | None]:
    """The job's operator and watermark strategy, as *args* say."""
    if args.window:
        if args.input or args.kafka or args.files:
            raise ConfigError("window", args.window, "the generator's input (its event_ts)")
        size = parse_duration("window", args.window)
        bound = parse_duration("out-of-orderness", args.out_of_orderness)
        windows = WindowAggregate(
            args.uid, key, Windows.tumbling(size), [Agg.count(), Agg.sum("amount")]
        )
        return windows, WatermarkStrategy.for_bounded_out_of_orderness("event_ts", bound)
    if args.follow_up:
        delay = parse_duration("follow-up", args.follow_up)
        return FollowUp(args.uid, key, key_type, delay), WatermarkStrategy.no_watermarks()
    return RunningCount(args.uid, key, key_type), None


def join_job(
    args: argparse.Namespace, source: dict[str, object]
) -> tuple[KeyedOperator, dict[str, dict[str, object]], dict[str, WatermarkStrategy | None]]:
    """``--job join``: the interval join of two generated inputs, clicks and impressions."""
    from spark_ckpt.runtime.joins import IntervalJoin

    if args.input or args.kafka or args.files or args.window or args.follow_up:
        raise ConfigError("job", "join", "the generator's inputs, without --window/--follow-up")
    reach = parse_duration("join-interval", args.join_interval)
    bound = parse_duration("out-of-orderness", args.out_of_orderness)
    sources = {
        "clicks": dict(source),
        "impressions": {**source, "seed": args.seed + 1},
    }
    join = IntervalJoin(
        "clicks", "impressions", key="user_id", lower=-reach, upper=reach, time="event_ts"
    )
    strategy = WatermarkStrategy.for_bounded_out_of_orderness("event_ts", bound)
    return join, sources, {"clicks": strategy, "impressions": strategy}


COUNTRIES: Final = 5
USER_ROWS: Final = pa.schema(
    [
        ("user_id", pa.int64()),
        ("country", pa.int64()),
        ("amount", pa.int64()),
        ("total", pa.int64()),
    ]
)


class UserTotals(KeyedOperator):
    """``--job stages``, its first stage: per user, the running total of ``amount``; one row
    per input row, with the user's country (``user_id % 5``), for the next stage to re-key by.
    Vectorized: one sort per batch."""

    TOTAL = ValueStateDescriptor("total", pa.int64())

    def __init__(self, uid: str = "users") -> None:
        super().__init__(uid, "user_id", pa.int64())

    @property
    def output_schema(self) -> pa.Schema:
        return USER_ROWS

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        keys = batch.column("user_id").cast(pa.int64())
        amounts = batch.column("amount").cast(pa.int64()).to_numpy()
        distinct, codes, _ = rank_within_key(keys)
        before = state.get_values(self.TOTAL, distinct).fill_null(0).to_numpy(zero_copy_only=False)
        order = np.argsort(codes, kind="stable")
        sums = np.cumsum(amounts[order])  # per key, in row order: running sums within the batch
        starts = np.searchsorted(codes[order], np.arange(len(distinct)))
        within = sums - np.concatenate([[0], sums])[starts[codes[order]]]
        totals = np.empty_like(within)
        totals[order] = within
        added = np.bincount(codes, weights=amounts, minlength=len(distinct)).astype(np.int64)
        state.put_values(self.TOTAL, distinct, pa.array(before + added, pa.int64()))
        users = keys.to_numpy()
        return pa.table(
            [users, users % COUNTRIES, amounts, totals + before[codes]], schema=USER_ROWS
        )


def stages_job(args: argparse.Namespace) -> list[Stage]:
    """``--job stages``: per-user running totals (keyed by ``user_id``), then, re-keyed by
    ``country``, per-country running counts (``--stage-parallelism`` subtasks)."""
    if args.input or args.kafka or args.files or args.window or args.follow_up:
        raise ConfigError("job", "stages", "the generator's input, without --window/--follow-up")
    return [
        Stage(UserTotals(), name="users"),
        Stage(
            RunningCount("countries", "country"),
            name="countries",
            parallelism=args.stage_parallelism,
        ),
    ]


def run(
    spark: SparkSession,
    args: argparse.Namespace,
    settings: RestoreSettings,
    components: str | None = None,
) -> int:
    """The job on *spark*, as *args* say, restoring as *settings* say, with *components*
    (see :func:`main`); returns 0 when it stopped as asked. Raises what failed it (see
    :func:`main`); does not stop *spark*."""
    from spark_ckpt.pipeline.pipeline import Pipeline
    from spark_ckpt.pipeline.supervisor import StopReason
    from spark_ckpt.spark.datasource.source_options import default_root

    root = normalized(args.root or default_root(args.pipeline))
    output = normalized(args.output or sibling(root, f"{args.pipeline}_counts"))
    pipeline = Pipeline(spark, args.pipeline, config=build_config(args), root=root)
    source: dict[str, object]
    key, key_type = "user_id", pa.int64()
    transform: Callable[[Any], Any] | None = None
    if args.input:
        source = {"source": "delta", "path": normalized(args.input), "channels": args.channels}
    elif args.kafka:
        source = {
            "source": "kafka",
            "kafka.bootstrap.servers": args.kafka,
            "subscribePattern": args.subscribe_pattern,
            "startingOffsets": "earliest",
            "partitionDiscoveryIntervalMs": 1000,
        }
        key, key_type = "key", pa.binary()  # Kafka record keys
        if args.kafka_json:
            key, key_type, transform = "user_id", pa.int64(), parse_user_ids
    elif args.files:
        source = {
            "source": "files",
            "path": normalized(args.files),
            "format": "json",
            "schema": "user_id long",
            "channels": args.channels,
        }
        if args.files_archive:
            source["cleanSource"] = "archive"
            source["sourceArchiveDir"] = normalized(args.files_archive)
    else:
        source = {
            "source": "generator",
            "channels": args.channels,
            "rate": args.rate,
            "backlog": args.backlog,
            "keys": args.keys,
            "seed": args.seed,
        }
    if args.max_rows_per_trigger:
        limit = "maxOffsetsPerTrigger" if args.kafka else "maxRowsPerTrigger"
        if args.files:
            limit = "maxFilesPerTrigger"
        source[limit] = args.max_rows_per_trigger
        source["barrierPlacement"] = args.barrier_placement

    printing = threading.Lock()  # "stopping" comes from a thread of its own

    def say(text: str) -> None:
        if not args.quiet:
            with printing:
                sys.stdout.write(text + "\n")
                sys.stdout.flush()

    on = f"Spark Connect {args.remote}" if args.remote else "classic Spark"
    say(f"pipeline {args.pipeline!r} on {on}: root {root}, output {output}")
    say(LEGEND)
    say(HEADER)
    started = time.monotonic()
    rate = (
        None
        if args.input or args.kafka or args.files or args.rate <= 0
        else args.rate * args.channels * (2 if args.job == "join" else 1)
    )
    line = CheckpointLine(lambda: source_heads(spark, args.pipeline), rate)

    def progress(cp: CompletedCheckpoint) -> None:
        say(line.format(cp, committed_rows(output)))

    def stopping(reason: StopReason) -> None:
        if reason is StopReason.INTERRUPT:
            say("stopping... (final checkpoint; Ctrl-C again to stop at once without it)")
        else:
            say(f"stopping... (--seconds {args.seconds:g} reached; final checkpoint)")

    operator: KeyedOperator | list[Stage]
    operator, watermark = job_operator(args, key, key_type)
    sources: dict[str, dict[str, object]] | None = None
    watermarks: WatermarkStrategy | dict[str, WatermarkStrategy | None] | None = watermark
    if args.job == "join":
        operator, sources, watermarks = join_job(args, source)
    elif args.job == "stages":
        operator = stages_job(args)
    result = pipeline.run(
        None if sources is not None else source,
        operator,
        sources=sources,
        watermark=watermarks,
        output=output,
        parallelism=args.parallelism,
        placement=args.placement,
        available_now=args.available_now,
        duration_s=None if args.available_now or args.seconds <= 0 else args.seconds,
        on_checkpoint=progress,
        on_stop=stopping,
        restore=settings,
        transform=transform,
        components=components,
    )
    last = result.last_checkpoint
    restored = ", ".join("fresh" if r is None else str(r) for r in result.restored_from)
    say(
        f"stopped ({result.stopped_by.value}) after {time.monotonic() - started:.1f}s, "
        f"{result.restarts} restarts (restored from: {restored}); last checkpoint "
        f"{last.checkpoint_id if last else None}; rows committed {committed_rows(output)}"
    )
    return 0


if __name__ == "__main__":  # what escapes main (a bug) ends in one line, as under the CLI
    try:
        sys.exit(main())
    except Exception as e:
        sys.exit(fail(f"{type(e).__name__}: {e}", 1))
