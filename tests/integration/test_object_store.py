"""Pipelines on object storage (#42), against a real S3 endpoint (moto's server, started by
the tests): the pipeline root, the output and the Delta source on ``s3://``, run as a user
runs it, in a process whose environment points at the endpoint; and the failures a wrong
setting gives, each one line before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from conftest import DemoLauncher, generated_keys, running_count_rows
from deltalake import write_deltalake
from test_crash import (
    FIRST_CHECKPOINT_TIMEOUT_S,
    LAGGING_BACKLOG,
    _args,
    _completes_after,
    _final_positions,
    _finish,
    _kill_repeatedly,
    _latest,
    _latest_id,
)

from spark_ckpt import Pipeline
from spark_ckpt.coordination.requests import STOP
from spark_ckpt.errors import StoreError
from spark_ckpt.locations.objects import write_whole
from spark_ckpt.locations.uris import filesystem
from spark_ckpt.sources.generator import GeneratorSpec
from spark_ckpt.testing.s3_endpoint import S3Endpoint, Served, running_s3_endpoint

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

HERE = Path(__file__).parent
REPO = HERE.parents[1]
BUCKET = "lake"


def run(
    argv: list[str], *, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """*argv* in *env* (and *cwd*), its output captured."""
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=600, check=False, env=env, cwd=cwd
    )


def python(
    *argv: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """This interpreter with *argv*."""
    return run([sys.executable, *argv], env=env, cwd=cwd)


def job(
    script: str, *args: str, env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    """A job script of this folder, run in *cwd*: whatever it writes to a local path
    instead of the store (a URI taken for a path: a folder ``s3:``) shows there."""
    done = python(str(HERE / script), *args, env=env, cwd=cwd)
    assert not (cwd / "s3:").exists(), f"{script} wrote a local s3: folder"
    return done


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return python("-m", "spark_ckpt.cli", *args, env=env)


def write_source(uri: str) -> Counter[int]:
    """Three commits of (user_id, amount) rows; returns the rows per key."""
    keys: Counter[int] = Counter()
    for version in range(3):
        users = [(i * 7 + version) % 40 for i in range(300)]
        keys.update(users)
        data = pa.table({"user_id": pa.array(users, pa.int64()), "amount": list(range(300))})
        write_deltalake(uri, data, mode="append")
    return keys


def read_output(uri: str, s3: S3Endpoint) -> Counter[tuple[int, int]]:
    """The output table read back by a second Delta reader (polars) from the endpoint."""
    frame = pl.read_delta(uri, storage_options=s3.storage_options())
    return Counter(zip(frame["user_id"].to_list(), frame["count"].to_list(), strict=True))


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("placement", ["executors", "driver"])
def test_a_pipeline_with_root_output_and_source_on_s3_counts_exactly_once(
    on_s3: S3Endpoint, tmp_path: Path, placement: str
) -> None:
    base = f"s3://{BUCKET}/{placement}"
    source, root, out = f"{base}/clicks", f"{base}/root", f"{base}/counts"
    keys = write_source(source)
    scratch = tmp_path / "tmp"  # the job's local temporary directory
    scratch.mkdir()
    env = {**os.environ, **on_s3.environment(), "TMPDIR": str(scratch)}
    done = job("s3_job.py", root, out, source, placement, env=env, cwd=scratch)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["checkpoints"] >= 1 and result["failures"] == []
    assert read_output(out, on_s3) == running_count_rows(keys)
    # everything of the pipeline is on the endpoint; Spark's own checkpoint stayed local
    fs = pafs.S3FileSystem(endpoint_override=on_s3.url, scheme="http")
    stored = {
        Path(i.path).name for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/{placement}/root"))
    }
    assert {"checkpoints", "_runs"} <= stored and "_spark" not in stored
    spark_dirs = list((scratch / "spark-ckpt").iterdir())
    assert spark_dirs and all(not any(d.iterdir()) for d in spark_dirs)  # removed at the end
    # the CLI reads the same root from the endpoint
    listed = cli("checkpoints", "list", "--root", root, "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.strip().splitlines()) >= 1


def test_a_missing_bucket_is_one_line_before_anything_runs(
    on_s3: S3Endpoint, spark: SparkSession
) -> None:
    with pytest.raises(StoreError, match=r"s3://nolake/root.*the bucket 'nolake' does not exist"):
        Pipeline(spark, "p", root="s3://nolake/root")


def test_conditional_writes_turned_off_are_refused(
    on_s3: S3Endpoint, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_CONDITIONAL_PUT", "disabled")
    with pytest.raises(StoreError, match="AWS_CONDITIONAL_PUT=etag"):
        Pipeline(spark, "p", root=f"s3://{BUCKET}/unsafe")
    fs = pafs.S3FileSystem(endpoint_override=on_s3.url, scheme="http")
    assert fs.get_file_info(f"{BUCKET}/unsafe").type == pafs.FileType.NotFound  # nothing written


def test_the_cli_names_the_root_in_one_error_line(s3: S3Endpoint) -> None:
    env = {**os.environ, **s3.environment()}
    cases = {
        "s3://nolake/root": "the bucket 'nolake' does not exist",
        f"s3://{BUCKET}/nothing-here": "no pipeline root at s3://lake/nothing-here",
    }
    for root, why in cases.items():
        done = cli("checkpoints", "list", "--root", root, env=env)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert lines[0].startswith("error: ") and why in lines[0] and root in lines[0]
    closed = {**env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    done = cli("checkpoints", "list", "--root", f"s3://{BUCKET}/root", env=closed)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "cannot reach the endpoint http://127.0.0.1:9" in lines[0]


def test_denied_access_is_one_line(tmp_path: Path) -> None:
    with running_s3_endpoint(auth=True) as denying:
        env = {**os.environ, **denying.environment()}
        done = cli("checkpoints", "list", "--root", f"s3://{BUCKET}/root", env=env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "access denied" in lines[0] and f"s3://{BUCKET}/root" in lines[0]


EXAMPLE_MARK = (
    "<!-- object-store example: run as written by tests/integration/test_object_store.py -->"
)


@pytest.mark.spark
@pytest.mark.slow
def test_the_readmes_object_store_example_runs_as_written(s3: S3Endpoint, tmp_path: Path) -> None:
    """README's *Running on a cluster* commands, each run by bash with the environment
    pointing at the endpoint; the demo's running count is exactly-once by a fold over the
    generator's input (its options as the example gives them)."""
    text = (REPO / "README.md").read_text()
    block = text.split(EXAMPLE_MARK, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    env = {
        **os.environ,
        **s3.environment(),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    done = run(["bash", "-e", "-c", block], env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].split()[0].isdigit(), done.stdout  # a checkpoint
    # the example's options, and the demo's default seed (spark-ckpt demo --help)
    options = {"channels": "2", "rate": "0", "backlog": "5000", "keys": "100", "seed": "7"}
    spec = GeneratorSpec.from_options(options)
    expected = running_count_rows(generated_keys(spec, [5000, 5000]))
    assert read_output("s3://lake/orders_counts", s3) == expected
    assert not (tmp_path / "s3:").exists()  # run there: nothing went to a local path


def s3_log_actions(fs: pafs.FileSystem, table: str) -> list[tuple[int, list[dict[str, object]]]]:
    """(version, actions) of every commit file of the Delta table *table* (``bucket/key``)
    on the endpoint, in version order, parsed by hand."""
    infos = fs.get_file_info(pafs.FileSelector(f"{table}/_delta_log"))
    commits = sorted(i.path for i in infos if i.path.endswith(".json"))
    out = []
    for path in commits:
        with fs.open_input_stream(path) as f:
            lines = f.read().decode().splitlines()
        out.append((int(Path(path).stem), [json.loads(line) for line in lines if line.strip()]))
    return out


@pytest.mark.slow  # several Python processes
def test_two_coordinators_racing_on_an_s3_root_never_both_commit(on_s3: S3Endpoint) -> None:
    """Two coordinator processes take the lease in turn on one root on S3 and commit under
    it. Replayed by hand, the log holds exactly the commits that succeeded, each under the
    newest epoch leased before it: S3's conditional writes fenced every stale coordinator."""
    root = f"s3://{BUCKET}/race"
    env = {**os.environ, **on_s3.environment()}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "spark_ckpt.testing.lease_racer", root, "8"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.extend(json.loads(out))
    won = {(e, c) for e, c, r in results if r == "won"}
    fenced = {(e, c) for e, c, r in results if r == "fenced"}
    fs = pafs.S3FileSystem(endpoint_override=on_s3.url, scheme="http")
    newest, logged = 0, set()
    for _, actions in s3_log_actions(fs, f"{BUCKET}/race/checkpoints"):
        for action in actions:
            add = action.get("add")
            if not isinstance(add, dict):
                continue
            rows = pq.read_table(f"{BUCKET}/race/checkpoints/{add['path']}", filesystem=fs)
            for record, epoch, cid in zip(
                rows["record"].to_pylist(),
                rows["epoch"].to_pylist(),
                rows["checkpoint_id"].to_pylist(),
                strict=True,
            ):
                if record == "lease":
                    assert epoch > newest  # epochs strictly increase in log order
                    newest = epoch
                else:
                    assert epoch == newest  # no fenced coordinator committed
                    logged.add((epoch, cid))
    assert logged == won and not won & fenced
    assert len(won) + len(fenced) == 2 * 8 * 2


def count_rows(uri: str, s3: S3Endpoint) -> Counter[tuple[int, int]]:
    """A running-count output table, local or on the endpoint, read by polars."""
    if not uri.startswith("s3://"):
        return Counter(pl.read_delta(uri).select("user_id", "count").iter_rows())
    return read_output(uri, s3)


@pytest.mark.spark
@pytest.mark.slow
def test_a_savepoint_moves_from_s3_into_a_local_root(on_s3: S3Endpoint, tmp_path: Path) -> None:
    """A savepoint taken by a pipeline on S3 restores into a pipeline whose root is local, at
    another parallelism; the output goes on exactly once. (A savepoint restored into a new
    root on S3: :func:`test_the_files_source_on_s3_and_its_savepoint_into_a_new_root`.)"""
    s3_base, local = f"s3://{BUCKET}/s3-to-local", tmp_path / "local"
    first, savepoints, second = f"{s3_base}/root", f"{s3_base}/sp", str(local / "root")
    out = f"{s3_base}/out"
    env = {**os.environ, **on_s3.environment()}
    done = job("s3_savepoint_job.py", first, savepoints, second, out, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["savepoint"].startswith(savepoints)
    generator = GeneratorSpec(7, 2, 0.0, 300, 25)
    assert count_rows(out, on_s3) == running_count_rows(generated_keys(generator, [300, 300]))


@pytest.mark.spark
@pytest.mark.slow
def test_exactly_once_under_repeated_driver_sigkill_with_everything_on_s3(
    on_s3: S3Endpoint, demo: DemoLauncher, tmp_path: Path
) -> None:
    """``test_crash.py``'s aligned scenario with the root and the output on the endpoint:
    the job (driver, JVM, Python workers) SIGKILLed at random moments, then a final run;
    the output, read back by polars from the endpoint, is the fold over the generator's
    rows up to the final checkpoint's positions: 0 lost, 0 duplicated."""
    args = _args(tmp_path, "aligned", root=f"s3://{BUCKET}/crash/root")
    args = replace(args, output=f"s3://{BUCKET}/crash/out")
    story = _kill_repeatedly(demo, args, 2, seed=42)
    final = _finish(demo, args)
    positions = _final_positions(final, LAGGING_BACKLOG)
    expected = running_count_rows(generated_keys(args.spec(), positions))
    actual = read_output(str(args.output), on_s3)
    assert actual == expected, "\n".join(story)
    assert not (tmp_path / "s3:").exists()  # the jobs ran there: nothing went to a local path


@pytest.mark.spark
@pytest.mark.slow
def test_a_second_driver_on_an_s3_root_fences_the_first(
    on_s3: S3Endpoint, demo: DemoLauncher, tmp_path: Path
) -> None:
    """Two drivers on one root on the endpoint: the second's coordinator takes the lease,
    the first ends with one clear error; the second keeps checkpointing, stops on a CLI
    request that goes through the mailbox on the endpoint, and the output is exactly the
    fold over the input up to the stop's final checkpoint."""
    args = _args(tmp_path, "aligned", root=f"s3://{BUCKET}/fenced/root")
    args = replace(args, output=f"s3://{BUCKET}/fenced/out")
    first = demo.start(args)
    demo.wait_until(
        first, _completes_after(args.root, 0), FIRST_CHECKPOINT_TIMEOUT_S, "a checkpoint"
    )
    second = demo.start(args)
    ended = first.wait(FIRST_CHECKPOINT_TIMEOUT_S)
    assert ended == 1, f"{first.tail()}\n--- second:\n{second.tail()}"
    assert "taken over by another driver" in first.tail(1), first.tail()
    taken = _latest_id(args.root)
    demo.wait_until(
        second, _completes_after(args.root, taken), FIRST_CHECKPOINT_TIMEOUT_S, "a checkpoint"
    )
    env = {**os.environ, **on_s3.environment()}
    stopped = cli("stop", "--root", str(args.root), "--timeout", "180", env=env)
    assert stopped.returncode == 0, stopped.stderr + second.tail()
    assert second.wait(120) == 0, second.tail()
    final = _latest(args.root)
    assert final is not None and STOP in final.properties, second.tail()
    offsets = final.offsets()
    positions = [offsets[("source", c)] for c in range(len(LAGGING_BACKLOG))]
    expected = running_count_rows(generated_keys(args.spec(), positions))
    assert read_output(str(args.output), on_s3) == expected
    assert not (tmp_path / "s3:").exists()  # the jobs ran there: nothing went to a local path


def test_a_coordination_file_on_s3_is_one_put_and_a_listing_one_request(
    on_s3: S3Endpoint,
) -> None:
    """What the mailbox, heartbeats and run files cost per write and per poll: a whole file
    is one PUT (not a multipart upload's three requests, nor a rename's copy and delete),
    and a listing of a folder is one request."""
    fs, path = filesystem(f"s3://{BUCKET}/costs")
    first = len(on_s3.requests())
    write_whole(fs, f"{path}/box/message.json", b"{}")
    fs.get_file_info(pafs.FileSelector(f"{path}/box", allow_not_found=True))
    served = wait_for_requests(on_s3, first, 2)
    assert [(r.method, r.path) for r in served] == [
        ("PUT", f"/{BUCKET}/costs/box/message.json"),
        ("LIST", f"/{BUCKET}/costs/box/"),
    ]


def wait_for_requests(s3: S3Endpoint, first: int, n: int) -> list[Served]:
    """The requests served from index *first* on, once there are *n* (the endpoint logs a
    request just after answering it); more than *n* fails."""
    deadline = time.monotonic() + 30
    while len(s3.requests()) < first + n and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # a stray extra request would show now
    return s3.requests()[first:]


@pytest.mark.spark
@pytest.mark.slow
# explicit credentials only: the environment's reach every other test on the endpoint
@pytest.mark.parametrize("credentials", ["explicit"])
def test_offline_state_and_the_stateless_sink_on_s3(
    s3: S3Endpoint, tmp_path: Path, credentials: str
) -> None:
    """``StateReader``, ``format("ckpt-state")`` and ``SavepointWriter`` read and write a
    pipeline's state on the endpoint, and a stateless ``ckpt-source`` → ``ckpt-sink`` query
    with its store and output there commits exactly the rows up to its final checkpoint:
    with the credentials in the environment, or given explicitly to each (no ``AWS_*``
    variable set)."""
    on_s3 = s3
    base = f"s3://{BUCKET}/offline-{credentials}"
    if credentials == "environment":
        env = {**os.environ, **s3.environment()}
    else:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env["SPARK_CKPT_TEST_STORAGE_OPTIONS"] = json.dumps(s3.storage_options())
    done = job("s3_offline_job.py", base, str(tmp_path), env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    spec = GeneratorSpec(7, 2, 0.0, 200, 25)
    keys = generated_keys(spec, [200, 200])
    assert answer["state_keys"] == answer["state_rows_spark"] == len(keys)
    assert answer["written_keys"] == len(keys)
    assert read_output(f"{base}/counts", on_s3) == running_count_rows(keys)
    positions = answer["sink_positions"]
    sink = pl.read_delta(f"{base}/sink-out", storage_options=on_s3.storage_options())
    rows = GeneratorSpec(7, 2, 0.0, 300, 25)
    expected = Counter(
        user
        for channel, end in enumerate(positions)
        for user in rows.rows(channel, 0, end).column("user_id").to_pylist()
    )
    assert Counter(sink["user_id"].to_list()) == expected and sum(expected.values()) > 0


def land_on(uri: str, name: str, keys: list[int]) -> None:
    """A JSON-lines file of ``user_id`` rows at *uri*/*name* (one PUT: it lands whole)."""
    fs, base = filesystem(uri)
    with fs.open_output_stream(f"{base}/{name}") as out:
        out.write("".join(json.dumps({"user_id": k}) + "\n" for k in keys).encode())


@pytest.mark.spark
@pytest.mark.slow
def test_the_files_source_on_s3_and_its_savepoint_into_a_new_root(
    on_s3: S3Endpoint, tmp_path: Path
) -> None:
    """Files landing in an ``s3://`` directory, the root and the output on the endpoint,
    ``cleanSource=delete``: a pipeline stops with a savepoint on S3; more files land; a
    pipeline at a new root on S3 restores from the savepoint (a savepoint restored into a
    local root: ``test_a_savepoint_moves_from_s3_into_a_local_root``). The files the
    first one deleted are gone from the directory, yet every row counts exactly once: the
    savepoint carries the listing its positions mean."""
    base = f"s3://{BUCKET}/files"
    landing, out = f"{base}/landing", f"{base}/counts"
    written: Counter[int] = Counter()
    for i in range(6):
        keys = [(i * 13 + k) % 17 for k in range(40)]
        land_on(landing, f"part-{i}.json", keys)
        written.update(keys)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, **on_s3.environment(), "TMPDIR": str(scratch)}
    done = job(
        "s3_files_job.py", landing, f"{base}/root", f"{base}/savepoints", out, "160",
        env=env, cwd=scratch,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    savepoint = json.loads(done.stdout.strip().splitlines()[-1])["savepoint"]
    for i in range(6, 9):
        keys = [(i * 5 + k) % 17 for k in range(30)]
        land_on(landing, f"part-{i}.json", keys)
        written.update(keys)
    new_root = f"{base}/root2"
    done = job(
        "s3_files_job.py", "--restore", savepoint, landing, new_root, out, env=env, cwd=scratch
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_output(out, on_s3) == running_count_rows(written)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("placement", ["executors", "driver"])
def test_explicit_storage_options_reach_every_process_and_no_file(
    s3: S3Endpoint, tmp_path: Path, placement: str
) -> None:
    """No ``AWS_*`` variable anywhere: the job gives the endpoint and the credentials once,
    as ``Pipeline(..., storage_options=...)``. The driver, the source runner, the executors
    (or ``foreachBatch``) all reach the endpoint, exactly once; the secret shows in no object
    under the root, in neither the query's plan nor its progress, nor in the job's output."""
    base = f"s3://{BUCKET}/explicit-{placement}"
    source, root, out = f"{base}/clicks", f"{base}/root", f"{base}/counts"
    with pytest.MonkeyPatch.context() as patch:
        for key, value in s3.environment().items():
            patch.setenv(key, value)
        keys = write_source(source)
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    options = {**s3.storage_options(), "aws_secret_access_key": secret}
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env = {**clean, "TMPDIR": str(scratch), "SPARK_CKPT_TEST_STORAGE_OPTIONS": json.dumps(options)}
    done = job("s3_job.py", root, out, source, placement, env=env, cwd=scratch)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["checkpoints"] >= 1
    assert secret not in done.stdout and secret not in done.stderr
    frame = pl.read_delta(out, storage_options=s3.storage_options())
    assert Counter(zip(frame["user_id"], frame["count"], strict=True)) == running_count_rows(keys)
    fs = pafs.S3FileSystem(endpoint_override=s3.url, scheme="http", access_key="testing",
                           secret_key="testing", region="us-east-1")  # fmt: skip
    stored = fs.get_file_info(pafs.FileSelector(f"{BUCKET}/explicit-{placement}", recursive=True))
    for info in stored:
        if info.type is pafs.FileType.File:
            with fs.open_input_stream(info.path) as f:
                assert secret.encode() not in f.read(), info.path
