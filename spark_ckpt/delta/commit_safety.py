"""Whether delta-rs commits safely on a location: on S3 a commit is a conditional write of
the next log file (``If-None-Match: *``), which is what fences a second writer out of a
table (the coordinators' checkpoint log, the sink's output). delta-rs 1.x commits so by
default; its setting ``conditional_put`` (``AWS_CONDITIONAL_PUT``) turns it off, and then
a root or an output on S3 is refused before anything runs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

from spark_ckpt.errors import StoreError
from spark_ckpt.locations.credentials import for_delta
from spark_ckpt.locations.uris import scheme

#: delta-rs's storage option and environment variable of S3's conditional writes.
OPTION: Final = "conditional_put"
VARIABLE: Final = "AWS_CONDITIONAL_PUT"
#: Their values that turn conditional writes off.
_OFF: Final = frozenset({"disabled", "none", "false", "off", ""})


def check_commit_safety(uri: str, storage_options: Mapping[str, str] | None = None) -> None:
    """Raise :class:`StoreError`, naming the setting, when commits to the S3 location *uri*
        would not be conditional writes (*storage_options* first, then the options installed for
    its bucket, then the environment). Other
        locations commit by a rename that never replaces (local) or their store's own
        preconditions. No request."""
    if scheme(uri) not in ("s3", "s3a"):
        return
    options = {k.lower(): v for k, v in (for_delta(uri, storage_options) or {}).items()}
    value = options.get(OPTION, options.get(VARIABLE.lower(), os.environ.get(VARIABLE)))
    if value is not None and value.strip().lower() in _OFF:
        raise StoreError(
            f"cannot commit safely to {uri}: {VARIABLE}={value!r} turns off the conditional "
            f"writes (If-None-Match) that fence out a second writer on S3; set {VARIABLE}=etag "
            "(S3 and compatible stores that enforce If-None-Match)"
        )
