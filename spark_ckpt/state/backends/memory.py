"""The host's free memory, handed back to the system once a checkpoint completed.

A completed checkpoint frees what its snapshot held (the blobs' Arrow buffers) and the change
logs it made obsolete. Arrow's memory pool (mimalloc or jemalloc) and glibc's ``malloc``
keep such freed memory for reuse, so the host's RSS stays above what its state holds;
:func:`release_free_memory` asks both to return it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from functools import cache

import pyarrow as pa


@cache
def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        return ctypes.CDLL(name).malloc_trim  # type: ignore[no-any-return]
    return None


def release_free_memory() -> None:
    """Return the free memory of Arrow's pool and of glibc's heap to the system. Called on
    the task thread after a checkpoint's completion; O(free pages), in C; idempotent."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
