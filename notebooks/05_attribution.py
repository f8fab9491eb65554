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
# MAGIC    operator: a running count of attributions per ad, at another parallelism. The
# MAGIC    impressions buffered in the savepoint still match the clicks that come after it;
# MAGIC 4. checks against pandas: the pairs are pandas' join with the time condition.
# MAGIC
# MAGIC See `docs/graphs.md` for several inputs, joins and several outputs. `BASE` may be on
# MAGIC object storage (`s3://bucket/prefix`: a fresh prefix), with the store's credentials in
# MAGIC the environment or in `STORAGE_OPTIONS`.

# COMMAND ----------

# Parameters (the test suite overrides them with small values)
BASE = "/tmp/spark-ckpt-notebooks/05_attribution"
STORAGE_OPTIONS = None  # or {"AWS_ACCESS_KEY_ID": ..., "AWS_SECRET_ACCESS_KEY": ..., ...}
ADS = 8
MINUTES = 10  # minutes of event time
PARALLELISM = (2, 3)  # subtasks before the savepoint, and after the restore
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
# MAGIC ## 3. More rows, and a job with one more operator
# MAGIC Version 2 counts the attributions per ad after the join (a `RunningCount` with a new
# MAGIC uid: it starts empty) on 3 subtasks, into a table of its own. It restores the savepoint:
# MAGIC the join's state carries on, so a click just after the cut still finds an impression
# MAGIC shown just before it.

# COMMAND ----------

from spark_ckpt import RestoreSettings, RunningCount

land(first_half=False)
v2 = p.run(
    sources=SOURCES,
    operators=[attribution(), RunningCount("per_ad", "ad_id")],
    watermark=WATERMARKS,
    output=f"{BASE}/attributions_per_ad",
    parallelism=PARALLELISM[1],
    restore=RestoreSettings.savepoint(savepoint.path),
    available_now=True,
)
print(v2)

# COMMAND ----------

# MAGIC %md
# MAGIC ## 4. Checks
# MAGIC The pairs before the savepoint are pandas' join of the first half of the inputs with
# MAGIC the time condition; the running counts after it are, per ad, 1, 2, ... up to the pairs
# MAGIC of the whole input that the first run did not emit.

# COMMAND ----------

import polars as pl

shown = pd.DataFrame(impressions, columns=["ad_id", "shown_s", "impression_id"])
clicked = pd.DataFrame(clicks, columns=["ad_id", "clicked_s", "click_id"])


def pairs(shown, clicked):
    both = clicked.merge(shown, on="ad_id")
    both = both[(both.shown_s >= both.clicked_s - 10) & (both.shown_s <= both.clicked_s)]
    return set(zip(both.click_id, both.impression_id, strict=True))


before = pairs(shown[shown.shown_s < CUT], clicked[clicked.clicked_s < CUT])
every = pairs(shown, clicked)
out = pl.read_delta(f"{BASE}/attributed", storage_options=STORAGE_OPTIONS)
assert (
    out.height == len(before)
    and set(zip(out["click_id"], out["impression_id"], strict=True)) == before
)
spanning = {(c, i) for c, i in every - before if i in set(shown[shown.shown_s < CUT].impression_id)}
assert spanning, "a click after the cut matched an impression before it"

counts = pl.read_delta(f"{BASE}/attributions_per_ad", storage_options=STORAGE_OPTIONS)
per_ad = pd.Series([i for c, i in every - before]).map(
    dict(zip(shown.impression_id, shown.ad_id, strict=True))
)
expected = {ad: list(range(1, n + 1)) for ad, n in per_ad.value_counts().items()}
got = {ad: sorted(g["count"].to_list()) for (ad,), g in counts.group_by(["ad_id"])}
assert got == expected, (got, expected)
print(
    len(before),
    "pairs before the savepoint,",
    len(every - before),
    "after;",
    len(spanning),
    "across it",
)
