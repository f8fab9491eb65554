"""``ckpt-source`` routing its rows to the subtasks in ``read()`` (the executor path), driven
as Spark's source runner and executors drive it, without Spark. Oracle: the same source
read unrouted, with each data row's owner computed from its key here."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pytest

from datasources.source import CkptSource, CkptStreamReader
from spark_ckpt.errors import ConfigError
from spark_ckpt.protocol.barrier import CHECKPOINT_ID
from spark_ckpt.sources.stream_offset import StreamOffset
from spark_ckpt.spark.routing import GROUP, PAYLOAD, SUBTASK, Router, group_keys, subtask_rows
from spark_ckpt.state.keygroup import subtasks_for_keys

OPTIONS = {"pipeline": "p", "rate": "0", "backlog": "40,70,10", "channels": "3", "keys": "9"}
ROUTER = Router("user_id", 3, 16, 2)  # two partitions for three subtasks


def read_all(options: dict[str, str]) -> list[pa.RecordBatch]:
    source = CkptSource(options)
    reader = source.streamReader(source.schema())
    assert isinstance(reader, CkptStreamReader)
    start = StreamOffset.initial([0, 0, 0]).to_dict()
    end = StreamOffset((40, 70, 10), (0, 0, 0)).to_dict()
    return [b for p in reader.partitions(start, end) for b in reader.read(p)]


def rows(table: pa.Table) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r.values()) for r in table.to_pylist())


def test_every_subtask_gets_its_key_groups_rows_in_channel_order() -> None:
    plain = pa.Table.from_batches(read_all(OPTIONS))
    routed = pa.Table.from_batches(read_all({**OPTIONS, **ROUTER.options()}))
    assert routed.column_names == [GROUP, SUBTASK, PAYLOAD]
    groups = dict(zip(routed[SUBTASK].to_pylist(), routed[GROUP].to_pylist(), strict=True))
    assert len(set(groups.values())) == len(groups)  # one subtask per group
    owners = subtasks_for_keys(plain.column("user_id"), 16, 3).to_pylist()
    for s in range(3):
        payloads = [
            p
            for sub, p in zip(routed[SUBTASK].to_pylist(), routed[PAYLOAD].to_pylist(), strict=True)
            if sub == s
        ]
        mine = subtask_rows(payloads) if payloads else plain.slice(0, 0)
        expected = plain.filter(pa.array([o == s for o in owners]))
        assert rows(mine) == rows(expected)
        assert mine.column("_ckpt_channel").to_pylist() == sorted(
            mine.column("_ckpt_channel").to_pylist()
        )
        assert mine.column(CHECKPOINT_ID).null_count == mine.num_rows  # no barriers here


def test_a_routing_key_the_source_lacks_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"route\.key"):
        CkptSource({**OPTIONS, **Router("nope", 2, 16, 2).options()}).schema()


@pytest.mark.parametrize(("parallelism", "partitions"), [(1, 1), (2, 2), (4, 4), (5, 2), (8, 200)])
def test_group_keys_are_distinct_and_spread_by_subtask(parallelism: int, partitions: int) -> None:
    keys = group_keys(parallelism, partitions)
    assert len(set(keys)) == parallelism and min(keys) >= 0
