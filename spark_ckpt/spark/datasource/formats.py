"""The names of spark-ckpt's data sources, as ``format(...)`` takes them."""

from __future__ import annotations

from typing import Final

#: The streaming source whose rows carry checkpoint barriers.
SOURCE_FORMAT: Final = "ckpt-source"
#: The streaming sink with two-phase commit into a Delta table.
SINK_FORMAT: Final = "ckpt-sink"
#: The batch source of a checkpoint's or savepoint's state.
STATE_FORMAT: Final = "ckpt-state"
