"""``ckpt-source`` routing its rows to the subtasks in ``read()`` (the executor path), driven
as Spark's source runner and executors drive it, without Spark. Oracle: the same source
read unrouted, with each data row's owner computed from its key here."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datasources.ckpt_source import CkptSource, CkptStreamReader
from spark_ckpt.errors import ConfigError
from spark_ckpt.protocol.barrier import CHANNEL, CHECKPOINT_ID, OFFSET
from spark_ckpt.protocol.state_handles import encode_table
from spark_ckpt.sources.stream_offset import StreamOffset
from spark_ckpt.spark.executors.routing import (
    GROUP,
    PAYLOAD,
    SUBTASK,
    Router,
    group_keys,
    subtask_rows,
)
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


@st.composite
def payload_sets(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    """Payloads as a source's channels would hand them to one subtask: per channel a run of
    data rows then barrier rows, cut into one or more payloads; sometimes shuffled inside."""
    payloads: list[list[dict[str, Any]]] = []
    for channel in range(draw(st.integers(1, 4))):
        n_data = draw(st.integers(0, 6))
        start = draw(st.integers(0, 50))
        rows = [
            {"v": draw(st.integers(0, 9)), CHANNEL: channel, OFFSET: start + i, CHECKPOINT_ID: None}
            for i in range(n_data)
        ]
        rows += [
            {"v": None, CHANNEL: channel, OFFSET: start + n_data, CHECKPOINT_ID: c}
            for c in range(draw(st.integers(0, 2)))
        ]
        cuts = sorted(draw(st.lists(st.integers(1, max(1, len(rows) - 1)), max_size=2)))
        for a, b in zip([0, *cuts], [*cuts, len(rows)], strict=True):
            if rows[a:b]:
                payloads.append(rows[a:b])
    if draw(st.booleans()) and payloads:
        draw(st.randoms()).shuffle(payloads[0])
    return draw(st.permutations(payloads))


PAYLOAD_SCHEMA = pa.schema(
    [("v", pa.int64()), (CHANNEL, pa.int32()), (OFFSET, pa.int64()), (CHECKPOINT_ID, pa.int64())]
)


@given(payload_sets())
def test_a_subtask_gets_its_payloads_rows_in_channel_order(
    payloads: list[list[dict[str, Any]]],
) -> None:
    encoded = [encode_table(pa.Table.from_pylist(p, PAYLOAD_SCHEMA)) for p in payloads]
    rows_in = [r for p in payloads for r in p]
    expected = sorted(
        rows_in,
        key=lambda r: (
            r[CHECKPOINT_ID] is not None,
            r[CHANNEL],
            r[OFFSET],
            -1 if r[CHECKPOINT_ID] is None else r[CHECKPOINT_ID],
        ),
    )
    got = subtask_rows(encoded).to_pylist() if encoded else []
    keyed = [{k: r[k] for k in (CHANNEL, OFFSET, CHECKPOINT_ID)} for r in got]
    assert keyed == [{k: r[k] for k in (CHANNEL, OFFSET, CHECKPOINT_ID)} for r in expected]
    assert Counter(tuple(r.values()) for r in got) == Counter(tuple(r.values()) for r in rows_in)
