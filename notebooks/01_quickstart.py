# Databricks notebook source
# MAGIC %md
# MAGIC # spark-ckpt 01 — quickstart
# MAGIC
# MAGIC Two pipelines over the same replayable input (the deterministic generator: 2 channels,
# MAGIC a finite backlog per channel), both exactly-once into Delta:
# MAGIC
# MAGIC 1. **stateless**: `ckpt-source` → `ckpt-sink` (a two-phase-commit Delta sink);
# MAGIC 2. **stateful**: a keyed running count, its subtasks on the executors next to their state.
# MAGIC
# MAGIC Then we look at the checkpoint store: the checkpoints, their statistics, and the Delta
# MAGIC tables under the pipeline root; and we count the same rows landing as files in a
# MAGIC directory (`source=files`). Runs as a Databricks notebook or as plain Python, with
# MAGIC `BASE` on local disk or on object storage (`s3://bucket/prefix`: a fresh prefix, with the
# MAGIC store's credentials in the environment or in `STORAGE_OPTIONS`).

# COMMAND ----------

# Parameters (the test suite overrides them with small values)
BASE = "/tmp/spark-ckpt-notebooks/01_quickstart"
STORAGE_OPTIONS = None  # or {"AWS_ACCESS_KEY_ID": ..., "AWS_SECRET_ACCESS_KEY": ..., ...}
ROWS = 2000  # rows per channel
CHANNELS = 2
KEYS = 25

# COMMAND ----------

try:
    spark  # noqa: B018 - Databricks provides it
except NameError:
    from spark_ckpt import local_session

    spark = local_session("spark-ckpt-01-quickstart", log_level="ERROR")

import shutil

if "://" not in BASE:  # a local BASE starts empty; on a store, give a fresh prefix
    shutil.rmtree(BASE, ignore_errors=True)
SOURCE = {
    "source": "generator",
    "seed": 7,
    "channels": CHANNELS,
    "rate": 0,
    "backlog": ROWS,
    "keys": KEYS,
}

# COMMAND ----------

# MAGIC %md
# MAGIC ## 1. Stateless: `ckpt-source` → `ckpt-sink`
# MAGIC
# MAGIC The source emits barrier rows between data rows (`BARRIER_COLUMNS`); the sink stages
# MAGIC Parquet files and commits them into Delta when a checkpoint completes.
# MAGIC `Trigger.AvailableNow` reads what is there and ends with a final checkpoint.

# COMMAND ----------

from spark_ckpt import BARRIER_COLUMNS, CheckpointConfig, Pipeline

config = CheckpointConfig.from_options({"checkpoint.interval": "500ms"})
copy = Pipeline(
    spark, "copy", config=config, root=f"{BASE}/copy_root", storage_options=STORAGE_OPTIONS
)
events = copy.read(**SOURCE)
query = (
    events.select("user_id", "amount", "event_ts", *BARRIER_COLUMNS)
    .writeStream.format("ckpt-sink")
    .options(**copy.sink_options(f"{BASE}/copy_out"))  # pipeline, store, path
    .option("checkpointLocation", copy.spark_checkpoint_location())
    .trigger(availableNow=True)
    .start()
)
query.awaitTermination()

from deltalake import DeltaTable

copied = DeltaTable(f"{BASE}/copy_out", storage_options=STORAGE_OPTIONS).to_pandas()
print(
    len(copied), "rows copied; checkpoints:", [c.checkpoint_id for c in copy.client.checkpoints()]
)

# COMMAND ----------

# MAGIC %md
# MAGIC ## 2. Stateful: a keyed running count
# MAGIC
# MAGIC `RunningCount("counter", "user_id")` keeps a count per key in keyed state and emits
# MAGIC `(user_id, count)` per row. `counter` is the operator's **uid**: restores match state by
# MAGIC it (see notebook 02).

# COMMAND ----------

from spark_ckpt import RunningCount

counts = Pipeline(
    spark, "counts", config=config, root=f"{BASE}/counts_root", storage_options=STORAGE_OPTIONS
)
result = counts.run(
    SOURCE,
    RunningCount("counter", "user_id"),
    output=f"{BASE}/counts_out",
    parallelism=2,
    available_now=True,
)
print(result)

# COMMAND ----------

# MAGIC %md
# MAGIC The output table: one `(user_id, count)` row per input row. Rows become visible when the
# MAGIC checkpoint after them completes, in one Delta commit with that checkpoint's id.

# COMMAND ----------

out = DeltaTable(f"{BASE}/counts_out", storage_options=STORAGE_OPTIONS).to_pandas()
print(out.sort_values(["user_id", "count"]).head(10))
commits = DeltaTable(f"{BASE}/counts_out", storage_options=STORAGE_OPTIONS).history(3)
print([(c.get("version"), c.get("operation")) for c in commits])

# COMMAND ----------

# MAGIC %md
# MAGIC ## 3. Inspecting the checkpoints
# MAGIC
# MAGIC The client reads the pipeline root: completed checkpoints, their statistics, failures.
# MAGIC From a shell: `spark-ckpt checkpoints list --root ROOT`, `spark-ckpt stats --root ROOT`.

# COMMAND ----------

for cp in counts.client.checkpoints():
    s = cp.stats
    print(
        cp.checkpoint_id,
        cp.snapshot_type.value,
        f"{s.end_to_end_ms} ms",
        f"{s.state_bytes} B",
        dict(sorted(cp.offsets().items())),
    )
summary = counts.client.stats()
print(
    summary.checkpoints,
    "checkpoints;",
    "durations (ms):",
    summary.duration_ms,
    "; failures:",
    summary.failures,
)

# COMMAND ----------

# MAGIC %md
# MAGIC The store itself is four Delta tables under the root, readable by any Delta reader
# MAGIC (here `deltalake`; on a cluster with the Delta jars, `spark.read.format("delta")`):
# MAGIC `checkpoints` (the log), `operator_state` (state blobs), `channel_state`,
# MAGIC `source_offsets`. The state itself reads best through `ckpt-state`.

# COMMAND ----------

log = DeltaTable(f"{counts.root}/checkpoints", storage_options=STORAGE_OPTIONS).to_pandas()
print(log[["record", "checkpoint_id", "snapshot_type", "state_bytes"]])
offsets = DeltaTable(f"{counts.root}/source_offsets", storage_options=STORAGE_OPTIONS)
print(offsets.to_pandas().tail(CHANNELS))
state = spark.read.format("ckpt-state").options(**counts.state_options("counter", "count")).load()
state.orderBy("key").show(5)

# COMMAND ----------

# MAGIC %md
# MAGIC ## 4. Files landing in a directory
# MAGIC
# MAGIC `source=files` reads Parquet, JSON lines or CSV files as they land (here: the
# MAGIC generator's rows written as JSON-lines files). Each file is recorded once in a listing
# MAGIC under the pipeline root, so a replay reads the same files in the same order; a file is
# MAGIC archived (`cleanSource`) only once a completed checkpoint covers it. A writer writes
# MAGIC under a hidden name (`.` first) and renames the file into place (on object storage an
# MAGIC object appears whole when its upload ends, so a writer may put it in place directly).
# MAGIC `pipeline.filesystem(...)` is pyarrow's file system of a location, with the pipeline's
# MAGIC storage options.

# COMMAND ----------

import json

import pyarrow.fs as pafs

landed = Pipeline(
    spark, "landed", config=config, root=f"{BASE}/landed_root", storage_options=STORAGE_OPTIONS
)
landing = f"{BASE}/landing"
fs, landing_path = landed.filesystem(landing)
fs.create_dir(landing_path)
generated = copied.sort_values("event_ts")[["user_id", "amount"]]
for i, chunk in enumerate(range(0, len(generated), 500)):
    rows = generated.iloc[chunk : chunk + 500].to_dict("records")
    hidden = f"{landing_path}/.part-{i:03d}.json"
    with fs.open_output_stream(hidden) as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows).encode())
    fs.move(hidden, f"{landing_path}/part-{i:03d}.json")


def files_in(location):
    """The files directly in *location* (none if it does not exist)."""
    lfs, path = landed.filesystem(location)
    found = lfs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return [f for f in found if f.type is pafs.FileType.File and not f.base_name.startswith(".")]


landed_result = landed.run(
    {
        "source": "files",
        "path": landing,
        "format": "json",
        "schema": "user_id long, amount long",
        "channels": CHANNELS,
        "cleanSource": "archive",
        "sourceArchiveDir": f"{BASE}/landed_archive",
    },
    RunningCount("counter", "user_id"),
    output=f"{BASE}/landed_out",
    available_now=True,
)
landed_out = DeltaTable(f"{BASE}/landed_out", storage_options=STORAGE_OPTIONS).to_pandas()
print(landed_result)
print(
    len(landed_out),
    "rows counted from",
    len(files_in(landing)),
    "files still landing,",
    len(files_in(f"{BASE}/landed_archive")),
    "archived",
)

# COMMAND ----------

# MAGIC %md
# MAGIC ## 5. Checks
# MAGIC Every input row was copied once; the running count emitted `(key, 1..n)` once per key,
# MAGIC and the state holds each key's total.

# COMMAND ----------

assert len(copied) == CHANNELS * ROWS
assert len(out) == CHANNELS * ROWS
totals = out.groupby("user_id")["count"].agg(["max", "count"])
assert (totals["max"] == totals["count"]).all()  # gapless 1..n per key
assert not out.duplicated(["user_id", "count"]).any()
state_totals = dict(state.select("key", "value").toPandas().itertuples(index=False))
assert state_totals == totals["max"].to_dict()
landed_totals = landed_out.groupby("user_id")["count"].agg(["max", "count"])
assert len(landed_out) == CHANNELS * ROWS  # every landed row counted once
assert landed_totals["max"].to_dict() == totals["max"].to_dict()
print("01 quickstart: OK")
