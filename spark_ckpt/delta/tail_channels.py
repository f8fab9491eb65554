"""The channel logs of the Delta tail source: which rows of the tailed table each channel
holds, and at which position.

The *log of the table* is its data files in commit order: versions ascending from
``starting_version`` (version 0 holds the table's initial data), and within one version the
files it adds, sorted by their ``path`` as written in the Delta log. A file belongs to
channel :func:`file_channel` ``(path, channels)``. The log of channel *c* is the rows of its
files, file after file, each file's rows in file order. A channel position (offset) is the
number of rows of that channel's log before it, so ``heads()[c]`` is the number of rows
channel *c* holds so far.

Because committed Delta versions never change, the logs are a pure function of
``(table history, starting_version, channels)``: a source rebuilt after a restart, on any
process, assigns every row the same ``(channel, offset)``.
"""

from __future__ import annotations

import hashlib


def file_channel(path: str, channels: int) -> int:
    """The channel of the data file whose Delta-log ``path`` is *path*: the first 8 bytes of
    ``sha256(path.encode("utf-8"))`` as a big-endian unsigned integer, modulo *channels*.
    Stable across processes and Python versions."""
    digest = hashlib.sha256(path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % channels
