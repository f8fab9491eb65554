"""Files that readers see whole or not at all, on any location.

An object store makes a single object visible only once its upload completes (S3, GCS), so
an object is written in place: one request. A local file system and ADLS (files created
empty, then appended to) need a temporary name renamed into place.

Reading an object that is *replaced* in place (a status, a heartbeat, ``committed.json``)
has a race of its own: pyarrow asks for the object's size (HEAD), then for that many bytes
(a ranged GET); replaced in between, the bytes are a prefix of the new version, or fewer.
:func:`read_json` reads such a file again until it decodes.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Final

import pyarrow.fs as pafs

from spark_ckpt.errors import StoreError
from spark_ckpt.locations.uris import explain

#: pyarrow file systems whose objects appear only when their upload completes.
_WHOLE_ON_CLOSE = frozenset({"s3", "gcs"})


def writes_whole(fs: pafs.FileSystem) -> bool:
    """Whether a file written to *fs* in place is visible only once complete."""
    return fs.type_name in _WHOLE_ON_CLOSE


def write_whole(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write *data* at *path* so that readers see the whole file or none: in place on an
    object store (one request), else to a temporary name beside it renamed into place.
    Replaces what was there. Raises :class:`~spark_ckpt.errors.StoreError`."""
    directory = path.rsplit("/", 1)[0]
    try:
        if writes_whole(fs):
            with fs.open_output_stream(path) as out:
                out.write(data)
            return
        tmp = f"{directory}/.tmp-{uuid.uuid4().hex}"
        fs.create_dir(directory, recursive=True)
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        fs.move(tmp, path)
    except OSError as e:
        raise StoreError(f"cannot write {path}: {explain(path, e)}") from e


#: Reads of a replaced JSON file before its decoding error counts (each one a HEAD and a GET).
READ_ATTEMPTS: Final = 5


def read_json(fs: pafs.FileSystem, path: str) -> Any:
    """The JSON document at *path*, read whole even while a writer replaces it (see the
    module docstring): a read that does not decode, or ends early, is tried again, up to
    :data:`READ_ATTEMPTS` times. Raises ``FileNotFoundError`` when there is none, else the
    last ``OSError`` or ``ValueError``."""
    for attempt in range(READ_ATTEMPTS):
        try:
            with fs.open_input_stream(path) as f:
                return json.loads(f.read())
        except FileNotFoundError:
            raise
        except (OSError, ValueError):
            if attempt == READ_ATTEMPTS - 1:
                raise
            time.sleep(0.01 * (attempt + 1))
    raise AssertionError("unreachable")  # pragma: no cover
