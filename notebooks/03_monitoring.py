# Databricks notebook source
# MAGIC %md
# MAGIC # spark-ckpt 03 — monitoring
# MAGIC
# MAGIC Checkpoint statistics that last (they are in the pipeline's root, not in a driver's
# MAGIC memory): durations, sizes and alignment per checkpoint, failed and aborted checkpoints
# MAGIC with their reason, a plot over time — and **restore as of a time**: go back to the
# MAGIC checkpoint that was the latest at some moment (the Delta history of the checkpoint log
# MAGIC says which).

# COMMAND ----------

# Parameters (the test suite overrides them with small values)
BASE = "/tmp/spark-ckpt-notebooks/03_monitoring"
BATCHES = [1000, 2000, 3000]  # rows per channel after each run
CHANNELS = 2
KEYS = 25
PLOT = f"{BASE}/checkpoints.png"

# COMMAND ----------

try:
    spark  # noqa: B018 - Databricks provides it
except NameError:
    from spark_ckpt import local_session

    spark = local_session("spark-ckpt-03-monitoring", log_level="ERROR")

import shutil
import time
from datetime import UTC, datetime

shutil.rmtree(BASE, ignore_errors=True)


def source(rows: int) -> dict[str, object]:
    return {
        "source": "generator",
        "seed": 7,
        "channels": CHANNELS,
        "rate": 0,
        "backlog": rows,
        "keys": KEYS,
        "maxRowsPerTrigger": 400,
    }


# COMMAND ----------

# MAGIC %md
# MAGIC ## 1. A pipeline with history
# MAGIC Three bounded runs, each over more input. We note the time after the first one.

# COMMAND ----------

from spark_ckpt import CheckpointConfig, Pipeline, RunningCount

config = CheckpointConfig.from_options(
    {"checkpoint.interval": "300ms", "checkpoint.retained": "50"}
)
pipeline = Pipeline(spark, "monitored", config=config, root=f"{BASE}/root")
marks = []
for rows in BATCHES:
    pipeline.run(
        source(rows), RunningCount("counter", "user_id"), output=f"{BASE}/out", available_now=True
    )
    time.sleep(1.0)  # keep the moments apart (Delta commit times are in milliseconds)
    marks.append(datetime.now(UTC))
    time.sleep(1.0)

# COMMAND ----------

# MAGIC %md
# MAGIC ## 2. Statistics and the plot
# MAGIC From a shell: `spark-ckpt stats --root ROOT --plot checkpoints.png` (or `--json`).

# COMMAND ----------

from spark_ckpt import plot_checkpoint_stats

summary = pipeline.client.stats()
print(f"{summary.checkpoints} checkpoints, {summary.savepoints} savepoints")
print(
    "duration ms:",
    summary.duration_ms,
    "state bytes:",
    summary.state_bytes,
    "alignment ms:",
    summary.alignment_ms,
)
print("failed or aborted, by reason:", summary.failures)
for f in pipeline.client.failures():
    print(f.checkpoint_id, f.reason, f.message)
plot_checkpoint_stats(pipeline.root, PLOT)
print("plot:", PLOT)

# COMMAND ----------

# MAGIC %md
# MAGIC ## 3. Restore as of a time
# MAGIC Back to the checkpoint that was the latest right after the first run: its state, its
# MAGIC source positions, and the output table rolled back to what that checkpoint had
# MAGIC committed. Then the job reads on — and the output is again exactly the running count over
# MAGIC all input.

# COMMAND ----------

from spark_ckpt import RestoreSettings

result = pipeline.run(
    source(BATCHES[-1]),
    RunningCount("counter", "user_id"),
    output=f"{BASE}/out",
    available_now=True,
    restore=RestoreSettings.as_of(marks[0]),
)
restored = pipeline.client.checkpoints()
restored_from = [c for c in restored if "restored_from" in c.properties]
print("restored:", restored_from[-1].properties["restored_from"])

# COMMAND ----------

# MAGIC %md
# MAGIC ## 4. Checks

# COMMAND ----------


from deltalake import DeltaTable

out = DeltaTable(f"{BASE}/out").to_pandas()
with open(PLOT, "rb") as png:
    assert png.read(4) == b"\x89PNG"
assert summary.checkpoints >= len(BATCHES)
assert restored_from and dict(restored_from[-1].offsets()) == {
    ("source", c): BATCHES[0] for c in range(CHANNELS)
}
assert len(out) == CHANNELS * BATCHES[-1] and not out.duplicated(["user_id", "count"]).any()
per_key = out.groupby("user_id")["count"].agg(["max", "count"])
assert (per_key["max"] == per_key["count"]).all()
print("03 monitoring: OK")
