# Databricks notebook source
# MAGIC %md
# MAGIC # spark-ckpt 02 — savepoint and upgrade
# MAGIC
# MAGIC Flink's upgrade workflow on Spark: **stop with a savepoint, change the pipeline, restore**.
# MAGIC
# MAGIC 1. run a keyed running count and stop it with a savepoint (drained: everything available
# MAGIC    is read first);
# MAGIC 2. upgrade: rename the operator's uid and change the parallelism — the restore refuses
# MAGIC    state no operator claims unless we allow dropping it;
# MAGIC 3. bootstrap the renamed operator's state **offline** from the savepoint (State
# MAGIC    Processor-style), write a new savepoint, and restore from that instead: no state lost.
# MAGIC
# MAGIC See `docs/upgrades.md` for what may change between a savepoint and a restore. `BASE`
# MAGIC may be on object storage (`s3://bucket/prefix`: a fresh prefix), with the store's
# MAGIC credentials in the environment or in `STORAGE_OPTIONS`.

# COMMAND ----------

# Parameters (the test suite overrides them with small values)
BASE = "/tmp/spark-ckpt-notebooks/02_savepoint"
STORAGE_OPTIONS = None  # or {"AWS_ACCESS_KEY_ID": ..., "AWS_SECRET_ACCESS_KEY": ..., ...}
FIRST_ROWS = 1500  # rows per channel before the savepoint
MORE_ROWS = 3000  # rows per channel in total after the upgrade
CHANNELS = 2
KEYS = 25

# COMMAND ----------

try:
    spark  # noqa: B018 - Databricks provides it
except NameError:
    from spark_ckpt import local_session

    spark = local_session("spark-ckpt-02-savepoint", log_level="ERROR")

import shutil

if "://" not in BASE:  # a local BASE starts empty; on a store, give a fresh prefix
    shutil.rmtree(BASE, ignore_errors=True)


def source(rows: int) -> dict[str, object]:
    return {
        "source": "generator",
        "seed": 7,
        "channels": CHANNELS,
        "rate": 0,
        "backlog": rows,
        "keys": KEYS,
    }


# COMMAND ----------

# MAGIC %md
# MAGIC ## 1. Run, then stop with a savepoint
# MAGIC `savepoint.dir` is where savepoints go unless a request names a target. The stop drains:
# MAGIC the sources are read up to where they were when the stop arrived. From a shell:
# MAGIC `spark-ckpt savepoint stop --root ROOT --drain`.

# COMMAND ----------

from spark_ckpt import CheckpointConfig, Pipeline, RunningCount, list_savepoints

config = CheckpointConfig.from_options(
    {"checkpoint.interval": "500ms", "savepoint.dir": f"{BASE}/savepoints"}
)
v1 = Pipeline(spark, "orders", config=config, root=f"{BASE}/root", storage_options=STORAGE_OPTIONS)
run = v1.start(
    source(FIRST_ROWS), RunningCount("counter", "user_id"), output=f"{BASE}/out", trigger_s=0.5
)
final = run.stop(savepoint=True, drain=True)
[savepoint] = list_savepoints(f"{BASE}/savepoints")
print("savepoint", savepoint.checkpoint.checkpoint_id, "at", savepoint.path)
print("positions:", dict(sorted(savepoint.checkpoint.offsets().items())))

# COMMAND ----------

# MAGIC %md
# MAGIC The savepoint is a directory of Delta tables (metadata, state, channel positions) that
# MAGIC references nothing else: copy it, move it, delete the pipeline's root — it still restores.
# MAGIC Read its state offline with `StateReader` or `spark.read.format("ckpt-state")`:

# COMMAND ----------

from spark_ckpt import StateReader

reader = StateReader.open(savepoint.path, storage_options=STORAGE_OPTIONS)
print("operators with state:", reader.uids())
counts_at_savepoint = reader.keyed("counter", "count").to_pandas()
print(counts_at_savepoint.head())
state_options = v1.state_options("counter", "count", path=savepoint.path)
spark.read.format("ckpt-state").options(**state_options).load().orderBy("key").show(5)

# COMMAND ----------

# MAGIC %md
# MAGIC ## 2. Upgrade: a new uid, another parallelism
# MAGIC Version 2 names its operator `counter_v2` and runs 3 subtasks. Restoring the savepoint
# MAGIC as it is would leave the state of `counter` unclaimed — refused, naming the uid:

# COMMAND ----------

from spark_ckpt import RestoreSettings
from spark_ckpt.errors import RestoreError

v2 = Pipeline(
    spark, "orders", config=config, root=f"{BASE}/root_v2", storage_options=STORAGE_OPTIONS
)
try:
    v2.run(
        source(MORE_ROWS),
        RunningCount("counter_v2", "user_id"),
        output=f"{BASE}/out",
        parallelism=3,
        available_now=True,
        restore=RestoreSettings.savepoint(savepoint.path),
    )
    refused = None
except RestoreError as e:
    refused = str(e)
print("refused:", refused)

# COMMAND ----------

# MAGIC %md
# MAGIC `allow_non_restored_state=True` lets the restore go ahead: the state of `counter` is
# MAGIC dropped and the new operator `counter_v2` starts **empty**, while the sources resume at
# MAGIC the savepoint's positions. The counts then start again at 1 — the rows before the
# MAGIC savepoint are forgotten. (Into a scratch root and output here, to look at it.)

# COMMAND ----------

from deltalake import DeltaTable

scratch = Pipeline(
    spark, "orders", config=config, root=f"{BASE}/root_dropped", storage_options=STORAGE_OPTIONS
)
scratch.run(
    source(MORE_ROWS),
    RunningCount("counter_v2", "user_id"),
    output=f"{BASE}/out_dropped",
    parallelism=3,
    available_now=True,
    restore=RestoreSettings.savepoint(savepoint.path, allow_non_restored_state=True),
)
out_dropped = DeltaTable(f"{BASE}/out_dropped", storage_options=STORAGE_OPTIONS).to_pandas()
print(out_dropped.sort_values(["user_id", "count"]).head(5))

# COMMAND ----------

# MAGIC %md
# MAGIC Better: carry the state over **offline** — rename the uid in a new savepoint (the old one
# MAGIC stays as it is), then restore from the new one. Version 2 then counts on where version 1
# MAGIC stopped, into the same output table.

# COMMAND ----------

from spark_ckpt import SavepointWriter

upgraded = f"{BASE}/savepoints/orders-v2"
SavepointWriter.from_existing(reader).rename_operator("counter", "counter_v2").write(
    upgraded, storage_options=STORAGE_OPTIONS
)
result = v2.run(
    source(MORE_ROWS),
    RunningCount("counter_v2", "user_id"),
    output=f"{BASE}/out",
    parallelism=3,
    available_now=True,
    restore=RestoreSettings.savepoint(upgraded),
)
print(result)

# COMMAND ----------

# MAGIC %md
# MAGIC ## 3. Bootstrap a new operator's state
# MAGIC A savepoint can also be written from scratch — for example to start a pipeline with
# MAGIC counts imported from elsewhere. Here: every key starts at 100, and the sources start
# MAGIC where version 2 ended. The new pipeline claims all of the state.

# COMMAND ----------

seeded = f"{BASE}/savepoints/seeded"
(
    SavepointWriter.new("orders-seeded", max_parallelism=128, parallelism=2)
    .with_keyed_state("counter", "count", {"key": list(range(KEYS)), "value": [100] * KEYS})
    .with_source_offsets({("source", c): MORE_ROWS for c in range(CHANNELS)})
    .write(seeded, storage_options=STORAGE_OPTIONS)
)
v3 = Pipeline(
    spark, "orders-seeded", config=config, root=f"{BASE}/root_v3", storage_options=STORAGE_OPTIONS
)
v3.run(
    source(MORE_ROWS + 500),
    RunningCount("counter", "user_id"),
    output=f"{BASE}/out_seeded",
    available_now=True,
    restore=RestoreSettings.savepoint(seeded),
)

# COMMAND ----------

# MAGIC %md
# MAGIC ## 4. Checks
# MAGIC The output of versions 1 and 2 together is exactly one `(key, 1..n)` per input row (no row
# MAGIC lost or repeated across the upgrade); with the state dropped, each key counted from 1
# MAGIC again over the rows after the savepoint; the seeded pipeline counted on from 100.

# COMMAND ----------

out = DeltaTable(f"{BASE}/out", storage_options=STORAGE_OPTIONS).to_pandas()
assert refused is not None and "'counter'" in refused
assert [o for o in savepoint.checkpoint.offsets().values()] == [FIRST_ROWS] * CHANNELS  # drained
assert len(out) == CHANNELS * MORE_ROWS and not out.duplicated(["user_id", "count"]).any()
per_key = out.groupby("user_id")["count"].agg(["max", "count"])
assert (per_key["max"] == per_key["count"]).all()
# with the state dropped: only the rows after the savepoint, each key counted from 1 again
assert len(out_dropped) == CHANNELS * (MORE_ROWS - FIRST_ROWS)
dropped_per_key = out_dropped.groupby("user_id")["count"].agg(["min", "max", "count"])
assert (dropped_per_key["min"] == 1).all()
assert (dropped_per_key["max"] == dropped_per_key["count"]).all()
seeded_out = DeltaTable(f"{BASE}/out_seeded", storage_options=STORAGE_OPTIONS).to_pandas()
assert len(seeded_out) == CHANNELS * 500 and seeded_out["count"].min() == 101
print("02 savepoint and upgrade: OK")
