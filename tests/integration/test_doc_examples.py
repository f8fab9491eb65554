"""Every ```python block of README.md and docs/*.md runs as written.

The blocks of one document run in order, in one namespace (a block may build on the blocks
before it in the same document), in a temporary working directory (so the default pipeline
roots, ``./spark-ckpt-data/<name>``, land there). The examples' absolute paths — ``/lake``,
``/backups``, ``/other`` — are rewritten to directories under the test's temporary
directory; any other absolute path in an example fails the test, so a new example cannot
write outside it. Nothing else is substituted: the examples bound their own runs
(``duration_s``, ``available_now``, a stop request). ``local_session()`` in an example
returns the test session's ``spark`` (``getOrCreate``).

After a document has run, a few checks against oracles of their own (the generator's input
re-read from its spec, row counts of the Delta tables read without spark-ckpt) show that
the examples did what their text says.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest
from conftest import (
    generated_keys,
    logged_batches,
    output_rows,
    read_delta,
    running_count_rows,
)

from spark_ckpt.sources.generator import GeneratorSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = ["README.md", *(f"docs/{p.name}" for p in sorted((REPO / "docs").glob("*.md")))]
FENCE = re.compile(r"^```python\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
#: The examples' absolute directories, each standing for one under the test's tmp directory.
EXAMPLE_DIRS = ("lake", "backups", "other")
_ABSOLUTE = re.compile(r"""(?<=["'])/(\w+)""")


def python_blocks(document: str) -> list[str]:
    """The ```python blocks of *document*, in order."""
    return FENCE.findall((REPO / document).read_text())


def localized(block: str, base: Path) -> str:
    """*block* with its example directories under *base*; raises on any other absolute
    path in a string literal."""
    others = {m.group(0) for m in _ABSOLUTE.finditer(block) if m.group(1) not in EXAMPLE_DIRS}
    assert not others, f"absolute paths outside {EXAMPLE_DIRS} in an example: {others}"
    return _ABSOLUTE.sub(lambda m: f"{base}/{m.group(1)}", block)


def run_document(document: str, base: Path) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__doc_example__"}
    for i, block in enumerate(python_blocks(document)):
        exec(compile(localized(block, base), f"{document}[{i}]", "exec"), namespace)
    return namespace


def test_the_documents_have_python_examples() -> None:
    with_examples = {d for d in DOCUMENTS if python_blocks(d)}
    assert {"README.md", "docs/upgrades.md", "docs/spark-notes.md"} <= with_examples
    assert len(python_blocks("README.md")) >= 5


def test_example_paths_are_rewritten(tmp_path: Path) -> None:
    text = 'a = "/lake/x"; b = f"/backups/{a}"; c = "/other/root"'
    assert localized(text, tmp_path) == (
        f'a = "{tmp_path}/lake/x"; b = f"{tmp_path}/backups/{{a}}"; c = "{tmp_path}/other/root"'
    )
    with pytest.raises(AssertionError):
        localized('open("/etc/passwd")', tmp_path)


def _rows(path: Path) -> int:
    return int(read_delta(path).num_rows)


#: Documents whose examples run on the newest PySpark only: they use nothing of PySpark that
#: the others do not exercise already (the suite's time; ``make test-compat`` runs those)
NOT_COMPAT = {"docs/graphs.md"}


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize(
    "document",
    [
        d if d in NOT_COMPAT else pytest.param(d, marks=pytest.mark.compat)
        for d in DOCUMENTS
        if python_blocks(d)
    ],
)
def test_examples_run_as_written(
    document: str, spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    ns = run_document(document, tmp_path)
    lake = tmp_path / "lake"
    if document == "README.md":
        _check_readme(ns, spark, lake)
    elif document == "docs/upgrades.md":
        _check_upgrades(ns, tmp_path)
    elif document == "docs/time.md":
        _check_time(ns, tmp_path)
    elif document == "docs/monitoring.md":
        _check_monitoring(ns, lake)
    elif document == "docs/graphs.md":
        _check_graphs(ns, lake)
    elif document == "docs/state-backends.md":
        _check_state_backends(ns, lake)


def _check_state_backends(ns: dict[str, Any], lake: Path) -> None:
    """The rocksdb run and the hashmap run that resumed its checkpoint: the output is the
    running count of the generator's 2 x 30,000 rows, each row counted once."""
    assert ns["resumed"].restored_from[0] is not None
    spec = GeneratorSpec.from_options(
        {"channels": "2", "rate": "0", "backlog": "30000,30000", "keys": "1000000"}
    )
    assert output_rows(read_delta(lake / "user_counts")) == running_count_rows(
        generated_keys(spec, [30_000, 30_000])
    )


def _check_readme(ns: dict[str, Any], spark: SparkSession, lake: Path) -> None:
    from spark_ckpt.coordination.requests import STOP
    from spark_ckpt.coordination.runs import RunState
    from spark_ckpt.runtime.task import SOURCE_TASK

    assert ns["spark"] is spark  # local_session() returned the test session
    assert ns["result"].last_checkpoint is not None
    assert _rows(lake / "totals") == 2_000  # Totals passes its input through
    # keyed stages: a running total per user, then a running count per country (user % 5),
    # each the fold of the generator's 2 x 1,000 rows
    users = generated_keys(
        GeneratorSpec.from_options({"channels": "2", "rate": "0", "backlog": "1000"}), [1000, 1000]
    )
    assert _rows(lake / "user_totals") == 2_000
    per_country: Counter[int] = Counter()
    for user, n in users.items():
        per_country[user % 5] += n
    assert output_rows(read_delta(lake / "country_counts"), "country") == running_count_rows(
        per_country
    )
    # the Kafka example: 3 partitions of 100 JSON clicks over 5 users, the one with amount 0
    # of each partition filtered out, each other counted once
    kafka_counts = output_rows(read_delta(lake / "clicks_per_user"), "user")
    users = Counter(f"user-{i % 5}" for _ in range(3) for i in range(1, 100))
    assert kafka_counts == running_count_rows(users)
    # the files example: 50 users over 3 files, each counted once
    assert output_rows(read_delta(lake / "landing_counts")) == running_count_rows(
        Counter(range(50))
    )

    # the started run stopped by client.stop(savepoint=True, drain=True) — no run.stop()
    run = ns["run"]
    assert not run.query.isActive
    [status] = [s for s in ns["pipeline"].client.runs() if s.run_id == run.run_id]
    assert status.state is RunState.STOPPED
    assert ns["final"].is_savepoint and ns["sp"].path.endswith(
        f"savepoint-orders-{ns['final'].checkpoint_id}"
    )

    # the run in the driver resumed the pipeline's latest checkpoint (written by the runs on
    # the executors); /lake/counts is exactly the running count of the generator's rows up
    # to its final checkpoint
    in_driver = ns["in_driver"]
    assert in_driver.restored_from[0] is not None and in_driver.restarts == 0
    final_counts = in_driver.last_checkpoint
    spec = GeneratorSpec.from_options({"channels": "4", "rate": "2000", "keys": "100000"})
    ends = [final_counts.offsets()[(SOURCE_TASK.vertex, c)] for c in range(spec.channels)]
    assert output_rows(read_delta(lake / "counts")) == running_count_rows(
        generated_keys(spec, ends)
    )

    # the raw ckpt-sink query: stopped by stop_query with a final checkpoint, its output
    # exactly the generator's rows before the final barrier (re-read from the spec)
    last, query = ns["last"], ns["q"]
    assert not query.isActive and query.exception() is None and STOP in last.properties
    spec = GeneratorSpec.from_options({"channels": "4", "rate": "10000"})
    ends = [last.offsets()[(SOURCE_TASK.vertex, c)] for c in range(spec.channels)]
    assert sum(ends) > 0
    out = read_delta(lake / "orders_out")
    assert Counter(out.column("user_id").to_pylist()) == generated_keys(spec, ends)

    # the Delta tail read every row of that table once
    assert _rows(lake / "orders_per_user") == out.num_rows


def _check_upgrades(ns: dict[str, Any], base: Path) -> None:
    import pyarrow.compute as pc

    from spark_ckpt import StateReader

    assert ns["sp"].is_savepoint and ns["final"].is_savepoint
    assert (base / "backups" / "counts" / f"savepoint-counts-{ns['sp'].checkpoint_id}").is_dir()
    # the moved pipeline went on from the other root's checkpoint, in its own root
    original = {c.checkpoint_id: c for c in ns["pipeline"].client.checkpoints()}
    restored = original[ns["checkpoint_id"]].offsets()
    moved = ns["moved"].client.latest()
    assert moved is not None and moved.offsets().keys() == restored.keys()
    assert all(moved.offsets()[k] >= v for k, v in restored.items())
    # map_values kept the counts >= 3 only, and changed nothing else
    before = StateReader.open(ns["sp_path"]).keyed("counter", "count")
    pruned = StateReader.open(str(base / "backups" / "counts" / "pruned")).keyed("counter", "count")
    kept = before.filter(pc.greater_equal(before["value"], 3))
    assert sorted(zip(pruned["key"].to_pylist(), pruned["value"].to_pylist(), strict=True)) == (
        sorted(zip(kept["key"].to_pylist(), kept["value"].to_pylist(), strict=True))
    )
    # with_keyed_state: keys 1, 2, 3 count on from 100, 200, 300, the rest from nothing. The
    # run read the backlog plus what the rate produced meanwhile: the oracle is a fold over
    # exactly the rows up to its final checkpoint's positions
    out = read_delta(base / "lake" / "counts_bootstrapped")
    final = ns["fresh"].client.latest()
    assert final is not None
    ends = [final.offsets()[("source", c)] for c in range(ns["source"]["channels"])]
    assert all(end >= 1_000 for end in ends)  # at least the backlog of every channel
    spec = GeneratorSpec.from_options({k: str(v) for k, v in ns["source"].items() if k != "source"})
    seeded = {1: 100, 2: 200, 3: 300}
    expected = Counter(
        (key, seeded.get(key, 0) + i)
        for key, n in generated_keys(spec, ends).items()
        for i in range(1, n + 1)
    )
    got = Counter(zip(out["user_id"].to_pylist(), out["count"].to_pylist(), strict=True))
    assert got == expected
    assert {1, 2, 3} & {key for key, _ in got}  # the seeded keys are in the input


def _check_graphs(ns: dict[str, Any], lake: Path) -> None:
    """The interval join equals pandas' join with the time condition over the two tables;
    the unpaid orders are those a plain loop finds: no payment by the deadline, and the
    deadline behind the final watermark (the lower of the inputs' latest event times); the
    keyed stages: the first stage's table is that join with each ad's campaign, the second's
    a running count per campaign folded over it, and every subtask of both stages
    acknowledged every checkpoint."""
    clicks = read_delta(lake / "clicks").to_pandas()
    shown = read_delta(lake / "impressions").to_pandas()
    pairs = clicks.merge(shown, on="ad_id")
    pairs = pairs[
        (pairs.shown_at >= pairs.clicked_at - pd.Timedelta("10s"))
        & (pairs.shown_at <= pairs.clicked_at)
    ]
    out = read_delta(lake / "attributed").to_pandas()
    assert out.columns.tolist() == ["ad_id", "clicked_at", "click_id", "shown_at", "impression_id"]
    assert (
        sorted(zip(out.click_id, out.impression_id, strict=True))
        == sorted(zip(pairs.click_id, pairs.impression_id, strict=True))
        == [(1, 100), (3, 103), (4, 104)]
    )

    campaign_of = dict(zip(*read_delta(lake / "campaigns").to_pydict().values(), strict=True))
    staged = read_delta(lake / "attributed_to_campaigns").to_pandas()
    assert staged.columns.tolist() == [*out.columns, "campaign"]
    assert sorted(zip(staged.click_id, staged.impression_id, staged.campaign, strict=True)) == [
        (c, i, campaign_of[a])
        for c, i, a in sorted(zip(pairs.click_id, pairs.impression_id, pairs.ad_id, strict=True))
    ]
    per_campaign: Counter[str] = Counter()
    folded: Counter[tuple[str, int]] = Counter()
    for ad in pairs.ad_id:
        per_campaign[campaign_of[ad]] += 1
        folded[(campaign_of[ad], per_campaign[campaign_of[ad]])] += 1
    counted = read_delta(lake / "clicks_per_campaign")
    assert (
        output_rows(counted, "campaign")
        == folded
        == Counter({("spring", 1): 1, ("spring", 2): 1, ("spring", 3): 1})
    )
    checkpoints = ns["campaigns"].client.checkpoints()
    assert checkpoints
    for cp in checkpoints:
        assert sorted((a.task.vertex, a.task.subtask) for a in cp.tasks) == [
            ("chain", 0),
            ("chain", 1),
        ] + [("stage:campaigns", s) for s in range(3)]

    orders = read_delta(lake / "orders").to_pylist()
    payments = {p["order_id"]: p["paid_at"] for p in read_delta(lake / "payments").to_pylist()}
    latest = min(max(o["ordered_at"] for o in orders), max(payments.values()))
    timeout = pd.Timedelta("10min")
    expected = sorted(
        o["order_id"]
        for o in orders
        if o["ordered_at"] + timeout <= latest
        and (o["order_id"] not in payments or payments[o["order_id"]] > o["ordered_at"] + timeout)
    )
    assert sorted(read_delta(lake / "unpaid").column("order_id").to_pylist()) == expected == [2, 4]

    amounts = read_delta(lake / "amounts").to_pylist()
    assert sorted(r["order_id"] for r in read_delta(lake / "all_orders").to_pylist()) == list(
        range(10)
    )
    alerts = sorted(r["order_id"] for r in read_delta(lake / "alerts").to_pylist())
    assert alerts == sorted(r["order_id"] for r in amounts if r["amount"] > 500) == [6, 7, 8, 9]

    countries = {1: "FR", 2: "DE", 3: "FR"}
    enriched = {
        r["order_id"]: r["country"] for r in read_delta(lake / "orders_by_country").to_pylist()
    }
    assert enriched == {r["order_id"]: countries.get(r["order_id"]) for r in amounts}


def _check_monitoring(ns: dict[str, Any], lake: Path) -> None:
    """The API's counts are the client's; the second run read the rest of the backlog and
    its callback saw each checkpoint it completed, by id; the output is the running count
    of all 2 x 3000 rows."""
    client = ns["pipeline"].client
    completed = [c for c in ns["doc"]["history"] if c["status"] == "COMPLETED"]
    assert ns["doc"]["counts"]["completed"] == len(completed) >= 1
    assert ns["latest"]["id"] == max(c["id"] for c in completed)
    seen = [cid for cid, _ in ns["completed"]]
    assert seen and seen == sorted(seen) and min(seen) > ns["latest"]["id"]
    assert set(seen) <= {r.checkpoint_id for r in client.history()}
    spec = GeneratorSpec.from_options({"channels": "2", "rate": "0", "keys": "50"})
    assert output_rows(read_delta(lake / "watched_counts")) == running_count_rows(
        generated_keys(spec, [3000, 3000])
    )
    assert ns["html"].count("<svg") == 2


def _check_time(ns: dict[str, Any], base: Path) -> None:
    """The silent users are those a plain loop over the micro-batches Spark logged finds:
    after each batch the watermark is the lowest over the channels of their latest event
    time less 1 s, and a user is silent once it passes their latest event time + 5 s."""
    from spark_ckpt import StateReader

    silent = ns["silent"]
    spec = GeneratorSpec.from_options(
        {"channels": "2", "rate": "50", "backlog": "1000", "keys": "2000"}
    )
    top: dict[int, int] = {}
    last: dict[int, int] = {}
    expected: dict[int, int] = {}
    for batch in (b for run in logged_batches(silent.root, 2) for b in run):
        for channel, (start, end) in enumerate(batch.slices):
            rows = spec.rows(channel, start, end)
            ms = [t // 1000 for t in rows.column("event_ts").cast("int64").to_pylist()]
            for user, t in zip(rows.column("user_id").to_pylist(), ms, strict=True):
                last[user] = max(last.get(user, t), t)
                top[channel] = max(top.get(channel, t), t)
        if len(top) == 2:
            watermark = min(top.values()) - 1000 - 1  # max - bound (1 s) - 1 ms
            for user in [u for u, t in last.items() if t + 5000 <= watermark]:
                expected[user] = last.pop(user)
    out = read_delta(base / "lake" / "silent_users")
    got = dict(zip(out["user_id"].to_pylist(), out["silent_since"].to_pylist(), strict=True))
    assert got == expected and len(got) == out.num_rows > 0
    assert sorted(ns["pending"].column("key").to_pylist()) == sorted(last)
    # first sightings: within the hour, every user of the backlog once
    spec = GeneratorSpec.from_options(
        {"channels": "2", "rate": "0", "backlog": "500", "keys": "100"}
    )
    users = Counter(u for c in range(2) for u in spec.rows(c, 0, 500)["user_id"].to_pylist())
    sightings = read_delta(base / "lake" / "first_sightings")["user_id"].to_pylist()
    assert Counter(sightings) == Counter(set(users))
    # the late rows of the late-output example: every one counted is in its table, once
    late_stats = [r.stats for r in ns["late_clicks"].client.history() if r.stats is not None]
    late_table = read_delta(base / "lake" / "late_clicks")
    assert late_table.num_rows == sum(s.late_rows for s in late_stats) > 0
    on_time = read_delta(base / "lake" / "clicks_on_time")
    assert on_time.num_rows + late_table.num_rows == 2 * 1000  # every input row, one place
    # the operator that receives late rows: every row, none dropped, the late ones marked
    marked_stats = [r.stats for r in ns["marked"].client.history() if r.stats is not None]
    marked = read_delta(base / "lake" / "marked_clicks")
    assert marked.num_rows == 2 * 1000 and sum(s.dropped_rows for s in marked_stats) == 0
    assert sum(marked["late"].to_pylist()) == sum(s.late_rows for s in marked_stats) > 0
    assert sum(marked["late"].to_pylist()) == late_table.num_rows  # the same input, late alike
    # windows: pandas' 5 s counts, sums and means of every window the final watermark passed
    per_user = ns["per_user"]
    spec = GeneratorSpec.from_options(
        {"channels": "2", "rate": "50", "backlog": "1000", "keys": "20"}
    )
    ends = [b.slices for run in logged_batches(per_user.root, 2) for b in run][-1]
    frame = pd.concat(
        spec.rows(c, 0, end).select(["user_id", "amount", "event_ts"]).to_pandas()
        for c, (_, end) in enumerate(ends)
    )
    frame["ms"] = frame.event_ts.astype("int64") // 1000
    # the final watermark: the lowest channel's last event time less the 1 s bound and 1 ms
    tops = [
        spec.rows(c, end - 1, end)["event_ts"].cast("int64")[0].as_py()
        for c, (_, end) in enumerate(ends)
    ]
    mark = min(tops) // 1000 - 1000 - 1  # max - bound (1 s) - 1 ms
    frame["start"] = frame.ms - frame.ms % 5000
    grouped = frame.groupby(["user_id", "start"]).amount.agg(["count", "sum", "mean"])
    expected = sorted(
        (k, s, int(r["count"]), int(r["sum"]), round(float(r["mean"]), 6))
        for (k, s), r in grouped.iterrows()
        if s + 5000 - 1 <= mark
    )
    windows = read_delta(base / "lake" / "clicks_per_5s").to_pylist()
    got = sorted(
        (
            r["user_id"],
            int(r["window_start"].timestamp()) * 1000,
            r["count"],
            r["sum_amount"],
            round(r["mean_amount"], 6),
        )
        for r in windows
    )
    assert got == expected and len(got) > 0
    moved = StateReader.open(str(base / "backups" / "silent-a-minute-later")).timers("silent")
    assert sorted(moved.column("timestamp").to_pylist()) == sorted(
        t + 65_000 for t in last.values()
    )
