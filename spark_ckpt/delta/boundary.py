"""The one place where delta-rs, Arrow and OS errors become spark-ckpt errors.

Every module that talks to delta-rs (the checkpoint store, the 2PC sink, the Delta tail
source) wraps its I/O in :func:`delta_boundary`, naming what it was doing; the checkpoint
store's components use :func:`store_boundary`, its translation into store errors.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa
from deltalake.exceptions import DeltaError

from spark_ckpt.errors import CorruptCheckpointError, SparkCkptError, StoreError


@contextmanager
def delta_boundary(
    what: str,
    error: type[SparkCkptError],
    *,
    unreadable: type[SparkCkptError] | None = None,
) -> Iterator[None]:
    """Translate delta-rs / Arrow / OS errors raised inside the block into *error* (our own
    errors pass through). With *unreadable*, an undecodable or missing data file raises that
    instead — on read paths the Delta log says the file holds committed rows, so its loss is
    corruption, not a passing failure."""
    try:
        yield
    except SparkCkptError:
        raise
    except (pa.ArrowInvalid, FileNotFoundError) as e:
        if unreadable is not None:
            raise unreadable(f"{what}: unreadable data file: {e}") from e
        raise error(f"{what} failed: {type(e).__name__}: {e}") from e
    except (DeltaError, OSError, pa.ArrowException) as e:
        raise error(f"{what} failed: {type(e).__name__}: {e}") from e


@contextmanager
def store_boundary(what: str, *, reading: bool = False) -> Iterator[None]:
    """:func:`delta_boundary` into :class:`StoreError`; on read paths an unreadable data file
    is :class:`CorruptCheckpointError`. Also catches the ``UnicodeDecodeError`` of a damaged
    string column: pyarrow does not validate UTF-8 when it decodes Parquet, so such damage
    only surfaces when values are converted."""
    with delta_boundary(what, StoreError, unreadable=CorruptCheckpointError if reading else None):
        try:
            yield
        except UnicodeDecodeError as e:
            error = CorruptCheckpointError if reading else StoreError
            raise error(f"{what}: undecodable string data: {e}") from e
