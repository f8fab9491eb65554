# Databricks notebook source
# MAGIC %md
# MAGIC # spark-ckpt 03 — monitoring
# MAGIC
# MAGIC Checkpoint statistics that last (they are in the pipeline's root, not in a driver's
# MAGIC memory): durations, sizes and alignment per checkpoint, failed and aborted checkpoints
# MAGIC with their reason, a plot over time — and **restore as of a time**: go back to the
# MAGIC checkpoint that was the latest at some moment (the completion times the checkpoint log
# MAGIC and the history record say which). `BASE` may be on object storage
# MAGIC (`s3://bucket/prefix`: a fresh prefix), with the store's credentials in the environment
# MAGIC or in `STORAGE_OPTIONS`; the plot is a local file.

# COMMAND ----------

# Parameters (the test suite overrides them with small values)
BASE = "/tmp/spark-ckpt-notebooks/03_monitoring"
STORAGE_OPTIONS = None  # or {"AWS_ACCESS_KEY_ID": ..., "AWS_SECRET_ACCESS_KEY": ..., ...}
BATCHES = [1000, 2000, 3000]  # rows per channel after each run
CHANNELS = 2
KEYS = 25
PLOT = "/tmp/spark-ckpt-notebooks/03_monitoring_checkpoints.png"  # a local file
TIMEOUT_S = 1  # checkpoint timeout; the first run stalls longer than that

# COMMAND ----------

try:
    spark  # noqa: B018 - Databricks provides it
except NameError:
    from spark_ckpt import local_session

    spark = local_session("spark-ckpt-03-monitoring", log_level="ERROR")

import shutil
import time
from datetime import UTC, datetime

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
        "maxRowsPerTrigger": 100,  # several micro-batches per run
    }


# COMMAND ----------

# MAGIC %md
# MAGIC ## 1. A pipeline with history
# MAGIC Three bounded runs, each over more input. We note the time after each one.
# MAGIC
# MAGIC The first run is slow at first: its operator stalls on its first micro-batches (think of
# MAGIC a slow external call), longer than the checkpoint timeout. The checkpoints pending then
# MAGIC **expire** — failed checkpoints, on record with their reason — and the job goes on (up to
# MAGIC `checkpoint.tolerable-failures` of them in a row).

# COMMAND ----------

import pyarrow as pa

from spark_ckpt import CheckpointConfig, Pipeline, RunningCount, StateContext


class SlowStart(RunningCount):
    """A running count (same uid, same state) that stalls *stall_s* on each of its first
    *slow_calls* calls (one call per subtask and micro-batch)."""

    def __init__(self, uid: str, key_column: str, slow_calls: int, stall_s: float) -> None:
        super().__init__(uid, key_column)
        self.slow_calls, self.stall_s = slow_calls, stall_s

    def process_batch(self, batch: pa.Table, state: StateContext) -> pa.Table | None:
        if self.slow_calls > 0 and batch.num_rows:
            self.slow_calls -= 1
            time.sleep(self.stall_s)
        return super().process_batch(batch, state)


config = CheckpointConfig.from_options(
    {
        "checkpoint.interval": "300ms",
        "checkpoint.timeout": f"{TIMEOUT_S}s",
        "checkpoint.tolerable-failures": "10",
        "checkpoint.retained": "50",
    }
)
pipeline = Pipeline(
    spark, "monitored", config=config, root=f"{BASE}/root", storage_options=STORAGE_OPTIONS
)
marks = []
for i, rows in enumerate(BATCHES):
    operator = (
        # the first three micro-batches take longer than the timeout each: a checkpoint
        # triggered meanwhile waits behind one of them, so it expires
        SlowStart("counter", "user_id", slow_calls=3 * 2, stall_s=TIMEOUT_S)  # 2 subtasks
        if i == 0
        else RunningCount("counter", "user_id")
    )
    pipeline.run(source(rows), operator, output=f"{BASE}/out", available_now=True)
    time.sleep(1.0)  # keep the moments apart (Delta commit times are in milliseconds)
    marks.append(datetime.now(UTC))
    time.sleep(1.0)

# COMMAND ----------

# MAGIC %md
# MAGIC ## 2. Statistics and the plot
# MAGIC From a shell: `spark-ckpt stats --root ROOT --plot checkpoints.png` (or `--json`).

# COMMAND ----------

from spark_ckpt.client.stats_plot import plot_checkpoint_stats

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
failures = pipeline.client.failures()
for f in failures:
    print(f.checkpoint_id, f.reason, f.message)
plot_checkpoint_stats(pipeline.root, PLOT)
print("plot:", PLOT)

# COMMAND ----------

# MAGIC %md
# MAGIC ## 3. The checkpoint page
# MAGIC `pipeline.client` renders the page's overview right here: counts, the latest completed,
# MAGIC failed and restored checkpoints, charts of duration and size over time, the newest
# MAGIC history entries. In Jupyter it is the last expression of a cell (`_repr_html_`); on
# MAGIC Databricks, `displayHTML(pipeline.client.overview_html())`. The whole page, with the
# MAGIC subtasks of each checkpoint, the configuration, failures, runs and `/metrics` for
# MAGIC Prometheus: `spark-ckpt ui --root ROOT` from a shell, or `pipeline.client.serve()` here.

# COMMAND ----------

import urllib.request

overview = pipeline.client.overview_html()
try:
    displayHTML(overview)  # type: ignore[name-defined]
except NameError:
    print(f"overview: {overview.count('<svg')} charts, {overview.count('<tr>')} table rows")
server = pipeline.client.serve(port=0)  # 127.0.0.1, any free port
print("checkpoint page:", server.url)
with urllib.request.urlopen(server.url + "metrics") as response:
    metrics = response.read().decode()
print(next(line for line in metrics.splitlines() if "numberOfFailedCheckpoints{" in line))
server.shutdown()
pipeline.client  # noqa: B018 - Jupyter renders the overview

# COMMAND ----------

# MAGIC %md
# MAGIC ## 4. Restore as of a time
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
# MAGIC ## 5. Checks

# COMMAND ----------


from deltalake import DeltaTable

out = DeltaTable(f"{BASE}/out", storage_options=STORAGE_OPTIONS).to_pandas()
with open(PLOT, "rb") as png:
    assert png.read(4) == b"\x89PNG"
assert summary.checkpoints >= len(BATCHES)
assert any(f.reason == "expired" for f in failures), failures  # the stalled first run
assert restored_from and dict(restored_from[-1].offsets()) == {
    ("source", c): BATCHES[0] for c in range(CHANNELS)
}
assert len(out) == CHANNELS * BATCHES[-1] and not out.duplicated(["user_id", "count"]).any()
per_key = out.groupby("user_id")["count"].agg(["max", "count"])
assert (per_key["max"] == per_key["count"]).all()
print("03 monitoring: OK")
