# Databricks notebook source
# MAGIC %md
# MAGIC # spark-ckpt 04 — sessionization
# MAGIC
# MAGIC Clicks land as JSON-lines files in a directory; a pipeline cuts each user's clicks into
# MAGIC **sessions** by event time (a session ends after a gap without a click) and writes one
# MAGIC row per session to Delta, exactly once:
# MAGIC
# MAGIC 1. the clicks: several users, sessions of a few clicks, pauses longer than the gap, and
# MAGIC    clicks arriving out of order (never more than the watermark's bound);
# MAGIC 2. `WindowAggregate` with `Windows.session(gap)` under a bounded-out-of-orderness
# MAGIC    watermark: a session is emitted once the watermark passes its end;
# MAGIC 3. stop with a **savepoint** while sessions are open, land more clicks, **restore** at
# MAGIC    another parallelism: the open sessions carry on;
# MAGIC 4. the sessions, the checkpoint statistics (watermark, late rows, timers fired), and the
# MAGIC    timers of the sessions still open, read offline;
# MAGIC 5. checks against a plain-Python sessionization of the clicks.
# MAGIC
# MAGIC See `docs/time.md` for the rules of event time, watermarks, timers and windows. `BASE`
# MAGIC may be on object storage (`s3://bucket/prefix`: a fresh prefix), with the store's
# MAGIC credentials in the environment or in `STORAGE_OPTIONS`.

# COMMAND ----------

# Parameters (the test suite overrides them with small values)
BASE = "/tmp/spark-ckpt-notebooks/04_sessionization"
STORAGE_OPTIONS = None  # or {"AWS_ACCESS_KEY_ID": ..., "AWS_SECRET_ACCESS_KEY": ..., ...}
USERS = 12
MINUTES = 20  # minutes of event time with clicks
FILES = (6, 4)  # click files landing before the savepoint, and after it
CHANNELS = 2
PARALLELISM = (2, 3)  # subtasks before the savepoint, and after the restore
GAP_S = 30  # a session ends after this long without a click
BOUND_S = 5  # the watermark's bound: how far out of order clicks may arrive
SEED = 4

# COMMAND ----------

try:
    spark  # noqa: B018 - Databricks provides it
except NameError:
    from spark_ckpt import local_session

    spark = local_session("spark-ckpt-04-sessionization", log_level="ERROR")

import shutil

if "://" not in BASE:  # a local BASE starts empty; on a store, give a fresh prefix
    shutil.rmtree(BASE, ignore_errors=True)

# COMMAND ----------

# MAGIC %md
# MAGIC ## 1. The clicks
# MAGIC Each user clicks in sessions of 1 to 4 clicks less than a fifth of the gap apart, then
# MAGIC pauses for longer than the gap: two clicks of a user are either well within the gap or
# MAGIC well beyond it.
# MAGIC Each click **arrives** up to the bound after it happened; the files take the clicks in
# MAGIC order of arrival, so clicks are out of order within a file and from one file to the
# MAGIC next — but never by the bound or more, so **no click is late** (at or behind the
# MAGIC watermark when it arrives).
# MAGIC
# MAGIC The clicks arriving first land before the savepoint, the others after it. The cut falls
# MAGIC inside a session of one user, so that at least that session spans the savepoint.

# COMMAND ----------

import random
from datetime import UTC, datetime, timedelta

GAP_MS, BOUND_MS = GAP_S * 1000, BOUND_S * 1000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
T0_MS = (datetime(2024, 5, 1, 9, 0, tzinfo=UTC) - EPOCH) // timedelta(milliseconds=1)
PAGES = ["/", "/search", "/product", "/cart", "/checkout"]

rng = random.Random(SEED)
clicks = []  # (arrival ms, user, event time ms, page)
for u in range(USERS):
    user = f"user-{u:02d}"
    t = T0_MS + rng.randrange(20_000)
    while t < T0_MS + MINUTES * 60_000:
        for _ in range(rng.randint(1, 4)):  # a session: clicks under gap / 5 apart
            clicks.append((t + rng.randrange(BOUND_MS), user, t, rng.choice(PAGES)))
            t += rng.randrange(GAP_MS // 60, GAP_MS // 5)
        t += GAP_MS + rng.randrange(10_000, 90_000)  # a pause, longer than the gap
clicks.sort()  # in order of arrival


def sessionize(rows):
    """Plain Python: per user, clicks in event-time order; a click more than the gap after
    the previous one starts a new session (windows ``[t, t + gap)`` that touch merge, so a
    click exactly a gap after is still in the session — none of ours is). Each session as
    ``(user, start, end, clicks, checkouts)``, its end the last click plus the gap."""
    by_user = {}
    for _, user, ts, page in rows:
        by_user.setdefault(user, []).append((ts, page))
    out = []
    for user, mine in by_user.items():
        last = None
        for ts, page in sorted(mine):
            if last is None or ts - last > GAP_MS:
                out.append([user, ts, 0, 0, 0])
            session = out[-1]
            session[2] = ts + GAP_MS
            session[3] += 1
            session[4] += page == "/checkout"
            last = ts
    return sorted(tuple(s) for s in out)


# the cut: after the last-arriving click of the multi-click session nearest the middle
position = {(user, ts): i for i, (_, user, ts, _) in enumerate(clicks)}
spans = []
for user, start, end, n, _ in sessionize(clicks):
    if n > 1:
        at = [i for (u, ts), i in position.items() if u == user and start <= ts < end]
        spans.append((abs(sum(at) / len(at) - len(clicks) / 2), min(at), max(at)))
_, first_at, cut = min(spans)
before, after = clicks[:cut], clicks[cut:]


def split(rows, n):
    return [rows[i * len(rows) // n : (i + 1) * len(rows) // n] for i in range(n)]


files = split(before, FILES[0]) + split(after, FILES[1])  # in order of landing
assert all(files) and first_at < cut
for i, part in enumerate(files[1:], start=1):  # no click is late, by construction
    seen = max(ts for f in files[:i] for _, _, ts, _ in f)
    assert min(ts for _, _, ts, _ in part) > seen - BOUND_MS
print(len(clicks), "clicks by", USERS, "users in", len(files), "files;", len(before), "before")

# COMMAND ----------

# MAGIC %md
# MAGIC The files land in a directory, each written under a hidden name and renamed into
# MAGIC place (through `p.filesystem(...)`, pyarrow's file system of the directory with the
# MAGIC pipeline's storage options: the pipeline comes first here). The files source lists
# MAGIC them in order of landing (modification time, then name) and hands them to the
# MAGIC channels **round robin**: file *i* is channel `i % CHANNELS`'s.
# MAGIC
# MAGIC That matters for the watermark: each channel's watermark trails the latest click it has
# MAGIC read by the bound, and the pipeline's is the lowest over the channels. A channel that has
# MAGIC read nothing yet holds it back entirely. (`with_idleness` would leave a channel without
# MAGIC new rows out after a timeout, judged when the source plans a micro-batch; but an
# MAGIC `available_now` run plans none without rows — it does not tick.) So both phases land at
# MAGIC least one file per channel, and the final watermark is the lowest of the channels'
# MAGIC latest clicks, less the bound and 1 ms: the sessions ending after it stay open.

# COMMAND ----------

import json

from spark_ckpt import CheckpointConfig, Pipeline

config = CheckpointConfig.from_options(
    {"checkpoint.interval": "500ms", "savepoint.dir": f"{BASE}/savepoints"}
)
p = Pipeline(spark, "clicks", config=config, root=f"{BASE}/root", storage_options=STORAGE_OPTIONS)
landing = f"{BASE}/landing"
fs, landing_path = p.filesystem(landing)
fs.create_dir(landing_path)


def land(index, rows):
    hidden = f"{landing_path}/.clicks-{index:03d}.json"
    lines = []
    for _, user, ts, page in rows:
        when = (EPOCH + timedelta(milliseconds=ts)).isoformat(timespec="milliseconds")
        lines.append(json.dumps({"user": user, "ts": when, "page": page}) + "\n")
    with fs.open_output_stream(hidden) as f:
        f.write("".join(lines).encode())
    fs.move(hidden, f"{landing_path}/clicks-{index:03d}.json")


for i in range(FILES[0]):
    land(i, files[i])
with fs.open_input_stream(f"{landing_path}/clicks-000.json") as f:
    print(f.read().decode().splitlines()[0])

# COMMAND ----------

# MAGIC %md
# MAGIC ## 2. The pipeline
# MAGIC `WindowAggregate("sessions", "user", Windows.session(gap), ...)` keeps each user's open
# MAGIC sessions in keyed state, with an event-time timer per session at its end - 1. A session is
# MAGIC `[first click, last click + gap)`; it is emitted — once — when the watermark reaches its
# MAGIC end - 1, and leaves the state then. Here per session: the clicks, the last click, and a
# MAGIC user-defined aggregate (`Agg.of`: vectorized accumulators), the clicks on `/checkout`.
# MAGIC
# MAGIC The files source's `ts` column is a `TIMESTAMP`: an Arrow timestamp, as the watermark
# MAGIC strategy requires of its column.

# COMMAND ----------

import pyarrow as pa
import pyarrow.compute as pc

from spark_ckpt import (
    Accumulator,
    Agg,
    RestoreSettings,
    WatermarkStrategy,
    WindowAggregate,
    Windows,
)


def checkouts(rows):
    return pc.cast(pc.equal(rows["page"], "/checkout"), pa.int64())


sessions = WindowAggregate(
    "sessions",
    "user",
    Windows.session(timedelta(seconds=GAP_S)),
    [
        Agg.count("clicks"),
        Agg.max("ts", "last_click"),
        Agg.of("checkouts", [Accumulator("n", checkouts, "sum", "sum")], lambda a: a["n"]),
    ],
    key_type=pa.string(),
)
SOURCE = {
    "source": "files",
    "path": landing,
    "format": "json",
    "schema": "user STRING, ts TIMESTAMP, page STRING",
    "channels": CHANNELS,
}
WATERMARK = WatermarkStrategy.for_bounded_out_of_orderness("ts", timedelta(seconds=BOUND_S))
OUT = f"{BASE}/sessions"

# COMMAND ----------

# MAGIC %md
# MAGIC ## 3. Run, then stop with a savepoint
# MAGIC The run reads the files there and is stopped with a savepoint, drained (the input there
# MAGIC when the stop arrives is read first). Unlike Flink's `stop --drain`, the drain does not
# MAGIC push the watermark to the end of time: the sessions the watermark has not passed stay
# MAGIC open, in the savepoint's state, with their timers.

# COMMAND ----------

import polars as pl

run = p.start(
    SOURCE,
    sessions,
    output=OUT,
    watermark=WATERMARK,
    parallelism=PARALLELISM[0],
    trigger_s=0.5,
)
savepoint = run.stop(savepoint=True, drain=True)
savepoint_path = p.client.savepoint_path(savepoint)
emitted_before = pl.read_delta(OUT, storage_options=STORAGE_OPTIONS)
print("savepoint", savepoint.checkpoint_id, "at", savepoint_path)
print("positions:", dict(sorted(savepoint.offsets().items())))
print(len(emitted_before), "sessions emitted before the savepoint")

# COMMAND ----------

# MAGIC %md
# MAGIC ## 4. More clicks, and a restore at another parallelism
# MAGIC The rest of the clicks land; the pipeline restores the savepoint with more subtasks (the
# MAGIC sessions' state is rescaled by key group) and reads on with `available_now=True`: what is
# MAGIC there, then a final checkpoint. Its final watermark closes every session that ends by
# MAGIC then; the later ones stay open.

# COMMAND ----------

for i in range(FILES[0], len(files)):
    land(i, files[i])
result = p.run(
    SOURCE,
    sessions,
    output=OUT,
    watermark=WATERMARK,
    parallelism=PARALLELISM[1],
    available_now=True,
    restore=RestoreSettings.savepoint(savepoint_path),
)
print(result)

# COMMAND ----------

# MAGIC %md
# MAGIC ## 5. The sessions
# MAGIC One row per session: the user, `window_start` (the first click), `window_end` (the last
# MAGIC click plus the gap), and the aggregates.

# COMMAND ----------

table = pl.read_delta(OUT, storage_options=STORAGE_OPTIONS).sort("user", "window_start")
print(table.with_columns((pl.col("window_end") - pl.col("window_start")).alias("length")))

# COMMAND ----------

# MAGIC %md
# MAGIC ## 6. Checkpoint statistics
# MAGIC Each checkpoint records the watermark and, since the previous checkpoint, the late rows
# MAGIC and the timers fired (one per session emitted). The checkpoint that follows the
# MAGIC savepoint is the restore point (`restored_from` in its properties): the savepoint's state
# MAGIC brought into the root before anything ran, with the savepoint's watermark and no counts
# MAGIC of its own. From a shell: `spark-ckpt stats --root ROOT`.

# COMMAND ----------

from spark_ckpt.cli import main as spark_ckpt_cli


def when(ms):
    """Milliseconds since the epoch as a time of day (UTC)."""
    if ms is None:
        return None
    return (EPOCH + timedelta(milliseconds=int(ms))).time().isoformat("milliseconds")


history = [r for r in p.client.history() if r.stats is not None]
for r in history:
    s = r.stats
    print(
        r.checkpoint_id,
        r.snapshot_type.value,
        "watermark",
        when(s.watermark_ms),
        "late",
        s.late_rows,
        "dropped",
        s.dropped_rows,
        "timers fired",
        s.timers_fired,
    )
spark_ckpt_cli(["stats", "--root", p.root])

# COMMAND ----------

# MAGIC %md
# MAGIC ## 7. The open sessions, offline
# MAGIC The sessions the final watermark has not passed are still in the state: each with its
# MAGIC timer at end - 1, in the last checkpoint. `StateReader` reads them without running
# MAGIC anything (so does `spark.read.format("ckpt-state")`).

# COMMAND ----------

from spark_ckpt import StateReader

reader = StateReader.open(p.root, storage_options=STORAGE_OPTIONS)
timers = reader.timers("sessions").to_pandas()
print(timers.assign(at=[when(t) for t in timers["timestamp"]]))
open_windows = reader.keyed("sessions", "windows").to_pylist()
print(open_windows[:2])

# COMMAND ----------

# MAGIC %md
# MAGIC ## 8. Checks
# MAGIC The oracle is the plain sessionization above and the watermark rule: per channel (file
# MAGIC *i* is channel `i % CHANNELS`'s) the latest click less the bound and 1 ms (Flink's
# MAGIC rule), the lowest over the channels. Sessions whose end - 1 the watermark reached are
# MAGIC emitted, the others are open.
# MAGIC
# MAGIC - no click was late; the watermark at the savepoint and at the end is the rule's;
# MAGIC - before the savepoint: exactly the sessions of the clicks then that the watermark closed;
# MAGIC - at the end: exactly the sessions of all clicks that the final watermark closed, each
# MAGIC   once — those from before the savepoint among them, none twice — and the sessions that
# MAGIC   span the savepoint with their clicks from both sides (the restore resumed the state);
# MAGIC - the open sessions are in the state, each with its timer at end - 1.

# COMMAND ----------


def watermark(landed):
    tops = {}
    for i, part in enumerate(landed):
        top = max(ts for _, _, ts, _ in part)
        tops[i % CHANNELS] = max(tops.get(i % CHANNELS, top), top)
    assert len(tops) == CHANNELS  # every channel has read clicks
    return min(tops.values()) - BOUND_MS - 1


def rows(frame):
    ms = [pl.col(c).dt.epoch("ms") for c in ("window_start", "window_end")]
    return sorted(frame.select("user", *ms, "clicks", "checkouts").rows())


def spans_savepoint(session):
    user, start, end, *_ = session
    return any(u == user and start <= ts < end for _, u, ts, _ in before) and any(
        u == user and start <= ts < end for _, u, ts, _ in after
    )


mark_before, mark_end = watermark(files[: FILES[0]]), watermark(files)
expected_before = [s for s in sessionize(before) if s[2] - 1 <= mark_before]
everything = sessionize(clicks)
expected = [s for s in everything if s[2] - 1 <= mark_end]
still_open = [s for s in everything if s[2] - 1 > mark_end]
got = rows(table)

assert sum(r.stats.late_rows + r.stats.dropped_rows for r in history) == 0  # none late
assert sum(r.stats.timers_fired for r in history) == len(got)  # a timer per session emitted
assert savepoint.stats.watermark_ms == mark_before
[point] = [r for r in history if "restored_from" in r.properties]
assert point.stats.watermark_ms == mark_before  # the restore resumed the savepoint's watermark
assert p.client.latest().stats.watermark_ms == mark_end
landed_before = {  # per channel, the clicks of its files before the savepoint
    ("source", c): sum(len(f) for f in files[c : FILES[0] : CHANNELS]) for c in range(CHANNELS)
}
assert dict(savepoint.offsets()) == landed_before  # drained: all of them read
assert rows(emitted_before) == expected_before
assert got == expected  # the sessions of all clicks that the final watermark closed
assert len({(u, s) for u, s, *_ in got}) == len(got)  # each once
assert set(expected_before) <= set(got)  # those from before the savepoint among them
spanning = [s for s in everything if spans_savepoint(s)]
assert spanning  # the cut was made inside a session
ends = table.select(pl.col("window_end", "last_click").dt.epoch("ms"))
assert all(end - last == GAP_MS for end, last in ends.rows())  # the end: the last click + gap
assert sorted(zip(timers["key"], timers["timestamp"], strict=True)) == sorted(
    (u, e - 1) for u, _, e, *_ in still_open
)
assert set(timers["domain"]) <= {"event"}
assert sorted(
    (w["key"], window["start"], window["end"], window["clicks.count"])
    for w in open_windows
    for window in w["value"] or []
) == sorted((u, s, e, n) for u, s, e, n, _ in still_open)
print(
    f"04 sessionization: OK ({len(got)} sessions, {len(expected_before)} before the savepoint,"
    f" {len(spanning)} spanning it, {len(still_open)} still open)"
)
