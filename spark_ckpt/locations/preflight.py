"""Checking a location before anything runs, so that a wrong endpoint, missing credentials,
a missing bucket or denied access end in one :class:`~spark_ckpt.errors.StoreError` line
naming the location, and nothing half-written stays behind.

Costs: :func:`check_readable` one request (a HEAD of the location), :func:`check_writable`
three (that HEAD, a PUT and a DELETE of a probe object under the location); a local path
costs no request.
"""

from __future__ import annotations

import uuid

import pyarrow.fs as pafs

from spark_ckpt.errors import StoreError
from spark_ckpt.locations.uris import bucket, filesystem, is_remote, store_errors

#: The probe objects' folder under a checked location.
PROBE_DIR = "_probe"


def check_readable(uri: str) -> tuple[pafs.FileSystem, str]:
    """Resolve *uri* and ask the store for it: raises :class:`StoreError` if the store
    cannot be reached, refuses the credentials, or has no such bucket. Returns the file
    system and the path. A location that does not exist yet is fine."""
    fs, path = filesystem(uri)
    if not is_remote(uri):
        return fs, path
    with store_errors(uri, "read"):
        fs.get_file_info(path)
        name = bucket(uri)
        if name is not None and fs.get_file_info(name).type == pafs.FileType.NotFound:
            raise StoreError(f"cannot read {uri}: the bucket {name!r} does not exist")
    return fs, path


def check_writable(uri: str) -> tuple[pafs.FileSystem, str]:
    """:func:`check_readable`, then write and delete a probe object under *uri*: raises
    :class:`StoreError` when writing is denied."""
    fs, path = check_readable(uri)
    if not is_remote(uri):
        return fs, path
    probe = f"{path}/{PROBE_DIR}/{uuid.uuid4().hex}"
    with store_errors(uri, "write to"):
        with fs.open_output_stream(probe) as out:
            out.write(b"")
        fs.delete_file(probe)
    return fs, path
