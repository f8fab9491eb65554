# Databricks notebook source
# MAGIC %md
# MAGIC # spark-ckpt 05 — click-to-impression attribution
# MAGIC
# MAGIC Two inputs, ad **impressions** and **clicks**, each a Delta table that grows. A pipeline
# MAGIC attributes every click to the impressions of its ad shown up to 10 s before it (an
# MAGIC **interval join** on event time) and writes the pairs to Delta, exactly once:
# MAGIC
# MAGIC 1. the inputs: impressions of a few ads, clicks following some of them within seconds,
# MAGIC    and clicks without an impression;
# MAGIC 2. `IntervalJoin` over `sources={"clicks": ..., "impressions": ...}`, each input with
# MAGIC    its own watermark; one checkpoint covers both inputs' positions;
# MAGIC 3. stop with a **savepoint**, land more rows, and **restore** into a job with one more
# MAGIC    **stage**: the join (keyed by ad) at another parallelism, then its pairs re-keyed by
# MAGIC    impression, a running count of the clicks each impression got. The impressions
# MAGIC    buffered in the savepoint still match the clicks that come after it;
# MAGIC 4. checks against pandas: the pairs are pandas' join with the time condition, and the
# MAGIC    counts a plain fold over the pairs after the savepoint.
# MAGIC
# MAGIC See `docs/graphs.md` for several inputs, joins, several outputs and keyed stages.
# MAGIC `BASE` may be on object storage (`s3://bucket/prefix`: a fresh prefix), with the
# MAGIC store's credentials in the environment or in `STORAGE_OPTIONS`.

# COMMAND ----------

# Parameters (the test suite overrides them with small values)
BASE = "/tmp/spark-ckpt-notebooks/05_attribution"
STORAGE_OPTIONS = None  # or {"AWS_ACCESS_KEY_ID": ..., "AWS_SECRET_ACCESS_KEY": ..., ...}
ADS = 8
MINUTES = 10  # minutes of event time
PARALLELISM = (2, 3)  # the join's subtasks before the savepoint, and after the restore
STAGE_PARALLELISM = 2  # the subtasks of the stage the restore adds
SEED = 5

# COMMAND ----------

try:
    spark  # noqa: B018 - Databricks provides it
except NameError:
    from spark_ckpt import local_session

    spark = local_session("spark-ckpt-05-attribution", log_level="ERROR")

import shutil

if "://" not in BASE:  # a local BASE starts empty; on a store, give a fresh prefix
    shutil.rmtree(BASE, ignore_errors=True)

# COMMAND ----------

# MAGIC %md
# MAGIC ## 1. The inputs
# MAGIC Every few seconds an ad is shown; a third of the impressions get a click 1 to 8 s later,
# MAGIC and now and then a click comes for an ad not shown lately. Each table is written in
# MAGIC event-time order, the first half of the time now, the second half after the savepoint,
# MAGIC so no row is late.

# COMMAND ----------

import random
from datetime import UTC, datetime, timedelta

import pandas as pd
import pyarrow as pa
from deltalake import write_deltalake

T0 = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
rng = random.Random(SEED)
impressions, clicks = [], []
t = 0.0
while t < MINUTES * 60:
    ad = rng.randrange(ADS)
    impressions.append((ad, t, len(impressions)))
    if rng.random() < 1 / 3:
        clicks.append((ad, t + rng.uniform(1, 8), len(clicks)))
    if rng.random() < 0.05:
        clicks.append((rng.randrange(ADS), t + rng.uniform(0, 30), len(clicks)))
    t += rng.uniform(0.5, 4)
impressions.sort(key=lambda r: r[1])
clicks.sort(key=lambda r: r[1])
CUT = MINUTES * 30  # seconds: the first half lands before the savepoint


def table(rows, time_name, id_name):
    return pa.table(
        {
            "ad_id": pa.array([r[0] for r in rows], pa.int64()),
            time_name: pa.array(
                [T0 + timedelta(seconds=r[1]) for r in rows], pa.timestamp("ms", tz="UTC")
            ),
            id_name: pa.array([r[2] for r in rows], pa.int64()),
        }
    )


def land(first_half):
    """Append one half of each input to its Delta table."""
    keep = (lambda s: s < CUT) if first_half else (lambda s: s >= CUT)
    for rows, name, time_name, id_name in (
        (impressions, "impressions", "shown_at", "impression_id"),
        (clicks, "clicks", "clicked_at", "click_id"),
    ):
        part = [r for r in rows if keep(r[1])]
        write_deltalake(
            f"{BASE}/{name}",
            table(part, time_name, id_name),
            mode="append",
            storage_options=STORAGE_OPTIONS,
        )


land(first_half=True)
print(len(impressions), "impressions and", len(clicks), "clicks of", ADS, "ads")

# COMMAND ----------

# MAGIC %md
# MAGIC ## 2. The interval join, then a savepoint
# MAGIC A click at `t` joins the impressions of its ad shown in `[t - 10 s, t]`. Each input keeps
# MAGIC its own watermark (here 2 s behind its latest event time); the pipeline's is the lower
# MAGIC of the two. An impression leaves the join's state once the watermark is 10 s past it:
# MAGIC no click can match it any more. The stop drains both inputs, then takes a savepoint.

# COMMAND ----------

from spark_ckpt import CheckpointConfig, IntervalJoin, Pipeline, WatermarkStrategy, list_savepoints

SOURCES = {
    "clicks": {"source": "delta", "path": f"{BASE}/clicks"},
    "impressions": {"source": "delta", "path": f"{BASE}/impressions"},
}
bounded = WatermarkStrategy.for_bounded_out_of_orderness
WATERMARKS = {"clicks": bounded("clicked_at", "2s"), "impressions": bounded("shown_at", "2s")}


def attribution():
    return IntervalJoin(
        "clicks",
        "impressions",
        key="ad_id",
        lower="-10s",
        upper=0,
        time=("clicked_at", "shown_at"),
        uid="attribution",
    )


config = CheckpointConfig.from_options(
    {"checkpoint.interval": "500ms", "savepoint.dir": f"{BASE}/savepoints"}
)
p = Pipeline(
    spark, "attribution", config=config, root=f"{BASE}/root", storage_options=STORAGE_OPTIONS
)
run = p.start(
    sources=SOURCES,
    operators=attribution(),
    watermark=WATERMARKS,
    output=f"{BASE}/attributed",
    parallelism=PARALLELISM[0],
)
final = run.stop(savepoint=True, drain=True)
[savepoint] = list_savepoints(f"{BASE}/savepoints")
from deltalake import DeltaTable

# the version of the pairs table that holds the first run's pairs (checked in part 4)
first_version = DeltaTable(f"{BASE}/attributed", storage_options=STORAGE_OPTIONS).version()
print(
    "savepoint",
    savepoint.checkpoint.checkpoint_id,
    "channels",
    savepoint.checkpoint.properties["source.channels"],
)

# COMMAND ----------

# MAGIC %md
# MAGIC The savepoint holds both inputs' positions and the impressions and clicks still
# MAGIC waiting for a match, per ad (read offline):

# COMMAND ----------

from spark_ckpt import StateReader

reader = StateReader.open(savepoint.path, storage_options=STORAGE_OPTIONS)
waiting = reader.keyed("attribution", "right").to_pandas()  # the impressions
print(sum(len(v) for v in waiting["value"]), "impressions wait in the savepoint")

# COMMAND ----------

# MAGIC %md
# MAGIC ## 3. More rows, and a job with one more stage
# MAGIC Version 2 is a job of two **stages** (Flink's `keyBy` between operators). The first is
# MAGIC the join, with the same uid, keyed by `ad_id`, now on 3 subtasks; its pairs still go to
# MAGIC the `attributed` table (the stage's own `output`). The second re-keys those pairs by
# MAGIC `impression_id`, a column the join emits, and counts the clicks of each impression (a
# MAGIC `RunningCount` with a new uid: it starts empty) on 2 subtasks, into a table of its own.
# MAGIC It restores the savepoint: the join's state carries on, so a click just after the cut
# MAGIC still finds an impression shown just before it. One checkpoint covers both stages.

# COMMAND ----------

from spark_ckpt import RestoreSettings, RunningCount, Stage

land(first_half=False)
v2 = p.run(
    sources=SOURCES,
    operators=[
        Stage(attribution(), name="ads", output=f"{BASE}/attributed"),
        Stage(
            RunningCount("per_impression", "impression_id"),
            name="impressions",
            parallelism=STAGE_PARALLELISM,
        ),
    ],
    watermark=WATERMARKS,
    output=f"{BASE}/clicks_per_impression",
    parallelism=PARALLELISM[1],
    restore=RestoreSettings.savepoint(savepoint.path),
    available_now=True,
)
print(v2)
# every subtask of both stages acknowledged each checkpoint: 3 of the join, 2 of the counts
last = p.client.latest()
print("acknowledged by", sorted((ack.task.vertex, ack.task.subtask) for ack in last.tasks))

# COMMAND ----------

# MAGIC %md
# MAGIC ## 4. Checks
# MAGIC The pairs before the savepoint are pandas' join of the first half of the inputs with
# MAGIC the time condition, and after the restore the `attributed` table holds the join of the
# MAGIC whole input, each pair once. The running counts are a plain fold over the pairs the
# MAGIC first run did not emit: per impression, 1, 2, ... up to its clicks among them.

# COMMAND ----------

from collections import Counter

import polars as pl

shown = pd.DataFrame(impressions, columns=["ad_id", "shown_s", "impression_id"])
clicked = pd.DataFrame(clicks, columns=["ad_id", "clicked_s", "click_id"])


def pairs(shown, clicked):
    both = clicked.merge(shown, on="ad_id")
    both = both[(both.shown_s >= both.clicked_s - 10) & (both.shown_s <= both.clicked_s)]
    return set(zip(both.click_id, both.impression_id, strict=True))


before = pairs(shown[shown.shown_s < CUT], clicked[clicked.clicked_s < CUT])
every = pairs(shown, clicked)
first_run = pl.read_delta(
    f"{BASE}/attributed", version=first_version, storage_options=STORAGE_OPTIONS
)
assert (
    first_run.height == len(before)
    and set(zip(first_run["click_id"], first_run["impression_id"], strict=True)) == before
)
out = pl.read_delta(f"{BASE}/attributed", storage_options=STORAGE_OPTIONS)
assert (
    out.height == len(every)
    and set(zip(out["click_id"], out["impression_id"], strict=True)) == every
)
spanning = {(c, i) for c, i in every - before if i in set(shown[shown.shown_s < CUT].impression_id)}
assert spanning, "a click after the cut matched an impression before it"

# the second stage: a plain fold over the pairs v2 emitted (all but the first run's)
after = pd.DataFrame(sorted(every - before), columns=["click_id", "impression_id"])
clicks_so_far, expected = Counter(), Counter()
for impression in after.impression_id:
    clicks_so_far[impression] += 1
    expected[(impression, clicks_so_far[impression])] += 1
counts = pl.read_delta(f"{BASE}/clicks_per_impression", storage_options=STORAGE_OPTIONS)
got = Counter(zip(counts["impression_id"], counts["count"], strict=True))
assert got == expected and counts.height == len(after), (got, expected)
print(
    len(before),
    "pairs before the savepoint,",
    len(every - before),
    "after;",
    len(spanning),
    "across it",
)
