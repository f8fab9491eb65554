"""Several named inputs behind one ``ckpt-source``: the union form, the inputs' channels as
one source, and the errors a job of several inputs gets before it runs."""

from __future__ import annotations

import json
from dataclasses import replace

import pyarrow as pa
import pytest

from spark_ckpt.errors import ConfigError, RestoreError
from spark_ckpt.pipeline.job import JobSpec
from spark_ckpt.protocol.barrier import SnapshotType
from spark_ckpt.protocol.checkpoint import CheckpointStats, CompletedCheckpoint
from spark_ckpt.protocol.state_handles import SourceOffset, TaskId, TaskStateHandle
from spark_ckpt.runtime.event_time import WatermarkStrategy
from spark_ckpt.runtime.joins import IntervalJoin
from spark_ckpt.runtime.operator import RunningCount
from spark_ckpt.runtime.restore_settings import PipelineShape, RestoreSettings, check_restorable
from spark_ckpt.sources.generator import GeneratorSource, GeneratorSpec
from spark_ckpt.sources.inputs import INPUT_KEY, INPUT_TIME, Inputs, InputSpec
from spark_ckpt.sources.inputs_source import InputsSource, key_type
from spark_ckpt.sources.kafka_options import CHANNEL_NAMES

JOIN = IntervalJoin("clicks", "views", key="user_id", lower=-1000, upper=0, time="event_ts")
WM = WatermarkStrategy.for_bounded_out_of_orderness("event_ts", "1s")


def generator(seed: int, channels: int) -> GeneratorSource:
    spec = GeneratorSpec.from_options(
        {"channels": str(channels), "rate": "0", "backlog": "10", "seed": str(seed)}
    )
    return GeneratorSource(spec, lambda: 0)


def test_the_inputs_channels_are_one_source_in_the_union_form() -> None:
    inputs = Inputs(
        (InputSpec("clicks", 2, "user_id", "event_ts"), InputSpec("views", 1, "user_id", None))
    )
    source = InputsSource(inputs, [generator(1, 2), generator(2, 1)])
    assert source.channels == 3
    assert source.channel_names == ["clicks/0", "clicks/1", "views/0"]
    assert source.heads() == [10, 10, 10]
    assert source.schema.names == ["clicks", "views", INPUT_KEY, INPUT_TIME]
    rows = source.plan(2, 3, 7).read()  # the view input's only channel
    assert rows.num_rows == 4 and rows.column("clicks").null_count == 4
    own = generator(2, 1).plan(0, 3, 7).read()
    assert rows.column(INPUT_KEY).to_pylist() == own.column("user_id").to_pylist()
    assert rows.column(INPUT_TIME).null_count == 4  # the view input keeps no event time
    split = inputs.split(rows)
    assert list(split) == ["views"]
    assert split["views"].column("amount").to_pylist() == own.column("amount").to_pylist()
    with pytest.raises(Exception, match="unknown channel 3"):
        source.plan(3, 0, 1)


def test_key_columns_of_different_types_are_refused() -> None:
    inputs = Inputs((InputSpec("a", 1, "k"), InputSpec("b", 1, "k")))
    with pytest.raises(ConfigError, match="one Arrow type"):
        key_type(inputs, [pa.schema([("k", pa.int64())]), pa.schema([("k", pa.string())])])
    with pytest.raises(ConfigError, match="a column of input 'b'"):
        key_type(inputs, [pa.schema([("k", pa.int64())]), pa.schema([("j", pa.int64())])])


def test_bad_inputs_are_refused_before_anything_runs() -> None:
    sources = {"clicks": {"source": "generator"}, "views": {"source": "generator"}}
    with pytest.raises(ConfigError, match="an input of sources"):
        JobSpec.of(
            None, IntervalJoin("clicks", "shows", "k", 0, 0, time="t"), output="/o", sources=sources
        )
    with pytest.raises(ConfigError, match="inputs that operator"):
        JobSpec.of(None, JOIN, output="/o", sources={**sources, "other": {}})
    with pytest.raises(ConfigError, match="not both"):
        JobSpec.of({"source": "generator"}, JOIN, output="/o", sources=sources)
    with pytest.raises(ConfigError, match="names of a letter"):
        JobSpec.of(None, JOIN, output="/o", sources={"clicks": {}, "no way": {}})
    with pytest.raises(ConfigError, match="an input of sources"):
        JobSpec.of(None, JOIN, output="/o", sources=sources, watermark={"shows": WM})
    with pytest.raises(ConfigError, match="for every input, or for none"):
        JobSpec.of(None, JOIN, output="/o", sources=sources, watermark={"clicks": WM})
    with pytest.raises(ConfigError, match="watermark="):
        JobSpec.of(
            None,
            JOIN,
            output="/o",
            sources={**sources, "views": {"watermark.column": "event_ts"}},
        )
    with pytest.raises(ConfigError, match="a function per input name"):
        JobSpec.of(None, JOIN, output="/o", sources=sources, transform=lambda df: df)
    with pytest.raises(ConfigError, match="an input of sources"):
        JobSpec.of(None, JOIN, output="/o", sources=sources, transform={"x": lambda df: df})
    both = JobSpec.of(None, JOIN, output="/o", sources=sources, transform={"clicks": len})
    assert both.transform == {"clicks": len}
    job = JobSpec.of(None, JOIN, output="/o", sources=sources, watermark=WM)
    assert job.input_names == ("clicks", "views")
    assert dict(job.input_watermarks) == {"clicks": WM, "views": WM}
    # a one-input operator reads the union of its inputs
    union = JobSpec.of(None, RunningCount("c", "user_id"), output="/o", sources=sources)
    assert union.input_names == ("clicks", "views")
    # a graph of one input is a pipeline of one source
    one = JobSpec.of(
        None,
        RunningCount("c", "user_id"),
        output="/o",
        sources={"only": {"source": "delta"}},
        watermark={"only": WM},
    )
    assert one.inputs == () and one.source == {"source": "delta"} and one.watermark == WM


def _checkpoint(names: list[str] | None) -> CompletedCheckpoint:
    offsets = tuple(SourceOffset("source", c, 5) for c in range(len(names or [0, 1])))
    task = TaskStateHandle(TaskId("chain", 0), (), offsets)
    props = {} if names is None else {CHANNEL_NAMES: json.dumps(names)}
    return CompletedCheckpoint(9, SnapshotType.CHECKPOINT, (task,), CheckpointStats(0, 1), props)


SHAPE = PipelineShape("p", (), {}, 128, inputs=("clicks", "views"))


def test_restores_follow_the_inputs_by_name() -> None:
    latest = RestoreSettings.latest()
    # the same inputs; one added (it starts from its own start)
    check_restorable(_checkpoint(["clicks/0", "views/0"]), SHAPE, latest)
    check_restorable(_checkpoint(["clicks/0"]), SHAPE, latest)
    # one removed: refused unless its positions may be dropped
    gone = _checkpoint(["clicks/0", "views/0", "old/0"])
    with pytest.raises(RestoreError, match=r"input 'old'.*allow_non_restored_state"):
        check_restorable(gone, SHAPE, latest)
    check_restorable(gone, SHAPE, RestoreSettings.latest(allow_non_restored_state=True))
    # one source into named inputs, and the reverse
    with pytest.raises(RestoreError, match="single source"):
        check_restorable(_checkpoint(None), SHAPE, latest)
    with pytest.raises(RestoreError, match="named inputs"):
        check_restorable(_checkpoint(["clicks/0"]), replace(SHAPE, inputs=()), latest)


def test_the_inputs_limits_add_up() -> None:
    from spark_ckpt.spark.datasource.source_options import INPUTS, SourceOptions

    items = [
        {
            "name": "a",
            "channels": 1,
            "key": "user_id",
            "time": None,
            "options": {"source": "generator", "maxRowsPerTrigger": "100"},
        },
        {
            "name": "b",
            "channels": 1,
            "key": "user_id",
            "time": None,
            "options": {"source": "generator", "maxRowsPerTrigger": "50"},
        },
    ]
    parsed = SourceOptions.parse({"pipeline": "p", "source": "inputs", INPUTS: json.dumps(items)})
    assert parsed.max_rows_per_trigger == 150
    assert parsed.inputs is not None and parsed.inputs.names == ("a", "b")


class _Discovering(GeneratorSource):
    """A generator whose subscription has grown: a Kafka source's ``discover``, faked."""

    def discover(self) -> list[tuple[str, int]]:
        return [("orders", 3)]


def test_new_partitions_of_an_input_end_the_run_for_a_restart() -> None:
    """The inputs' source finds what its Kafka inputs find, named by input (the source runner
    then ends the run), and looks as often as the most eager Kafka input asks."""
    from spark_ckpt.spark.datasource.source_options import INPUTS, SourceOptions

    inputs = Inputs((InputSpec("a", 1, "user_id"), InputSpec("b", 1, "user_id")))
    spec = GeneratorSpec.from_options({"channels": "1", "rate": "0", "backlog": "10"})
    source = InputsSource(inputs, [generator(1, 1), _Discovering(spec, lambda: 0)])
    assert source.discover() == [("b/orders", 3)]
    kafka = {"source": "kafka", "kafka.bootstrap.servers": "localhost:1", "subscribe": "t"}
    items = [
        {"name": "a", "channels": 1, "key": "key", "options": kafka},
        {
            "name": "b",
            "channels": 1,
            "key": "key",
            "options": {**kafka, "partitionDiscoveryIntervalMs": "500"},
        },
        {"name": "c", "channels": 1, "key": "key", "options": {"source": "generator"}},
    ]
    parsed = SourceOptions.parse({"pipeline": "p", "source": "inputs", INPUTS: json.dumps(items)})
    assert parsed.discovery_interval_ms == 500
