"""Explicit storage options of a pipeline: credentials and endpoints given once, in code,
instead of (or over) the standard environment, for every process of the pipeline.

:class:`StorageOptions` holds delta-rs's option keys (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``,
``AWS_ALLOW_HTTP``; ``AZURE_STORAGE_ACCOUNT_NAME``, ``AZURE_STORAGE_ACCOUNT_KEY``; any
spelling delta-rs accepts) and the buckets they are for. It is a picklable value with an
explicit JSON encoding: the pipeline hands it to each process that runs its code (the source
runner and planners through a ``ckpt-source`` option whose key Spark redacts, the executors
and ``foreachBatch`` in their specs), and :meth:`StorageOptions.install` registers it in that
process: from then on :func:`~spark_ckpt.locations.uris.filesystem` builds pyarrow's file
system of those buckets from it, and :func:`for_delta` gives delta-rs the same options.

The options are never logged (the ``repr`` names the keys only) and never written under a
root. Installing is per process and per bucket: the last pipeline to install options for a
bucket is the one whose options that process uses there.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from spark_ckpt.errors import ConfigError

#: The ``ckpt-source``/``ckpt-sink`` option that carries a pipeline's storage options (Spark
#: redacts option keys that say ``secret`` wherever it shows options).
OPTION: Final = "storage.secret"

_lock = threading.Lock()
_installed: dict[str, dict[str, str]] = {}


def bucket_of(uri: str) -> str | None:
    """``scheme://bucket`` of an object-store URI (``s3a`` read as ``s3``), else None."""
    if "://" not in uri:
        return None
    parts = urlsplit(uri)
    found = parts.scheme.lower()
    if found in ("", "file"):
        return None
    found = {"s3a": "s3", "gcs": "gs"}.get(found, found)
    return f"{found}://{parts.netloc}" if parts.netloc else None


@dataclass(frozen=True, repr=False)
class StorageOptions:
    """Explicit store options for the buckets of a pipeline's locations (see the module
    docstring). Empty: the environment decides, as without them."""

    options: tuple[tuple[str, str], ...] = ()
    buckets: tuple[str, ...] = ()

    def __repr__(self) -> str:
        keys = ", ".join(k for k, _ in self.options)
        return f"StorageOptions(keys=[{keys}], buckets={list(self.buckets)})"

    def __bool__(self) -> bool:
        return bool(self.options)

    @staticmethod
    def of(
        options: Mapping[str, object] | None, locations: Iterable[str | None] = ()
    ) -> StorageOptions:
        """*options* (delta-rs keys to string values) for the buckets of *locations* (local
        paths are skipped). Raises :class:`ConfigError` for a key or value that is not a
        non-empty string."""
        pairs: list[tuple[str, str]] = []
        for key, value in (options or {}).items():
            if not isinstance(key, str) or not key.strip():
                raise ConfigError("storage_options", key, "keys that are non-empty strings")
            if not isinstance(value, str | int | bool):
                raise ConfigError(f"storage_options[{key!r}]", "(hidden)", "a string")
            pairs.append(
                (key.strip(), str(value).lower() if isinstance(value, bool) else str(value))
            )
        return StorageOptions(tuple(sorted(pairs)), ()).covering(*locations)

    def covering(self, *locations: str | None) -> StorageOptions:
        """These options, for the buckets of *locations* too."""
        found = {b for loc in locations if loc and (b := bucket_of(loc)) is not None}
        return StorageOptions(self.options, tuple(sorted(set(self.buckets) | found)))

    def as_dict(self) -> dict[str, str]:
        return dict(self.options)

    def to_json(self) -> str:
        return json.dumps({"options": dict(self.options), "buckets": list(self.buckets)})

    @staticmethod
    def from_json(text: str) -> StorageOptions:
        """Raises :class:`ConfigError` (naming the option, not its value) if *text* is not
        what :meth:`to_json` writes."""
        try:
            data = json.loads(text)
            options = {str(k): str(v) for k, v in data["options"].items()}
            buckets = [str(b) for b in data["buckets"]]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(OPTION, "(hidden)", "the storage options a pipeline sets") from e
        return StorageOptions(tuple(sorted(options.items())), tuple(sorted(buckets)))

    def install(self) -> None:
        """Use these options for their buckets in this process (see the module docstring).
        Idempotent; nothing for empty options."""
        if not self.options:
            return
        with _lock:
            for found in self.buckets:
                _installed[found] = dict(self.options)


#: No explicit options: the environment decides.
NO_STORAGE_OPTIONS: Final = StorageOptions()


def installed_for(uri: str) -> dict[str, str] | None:
    """The options installed in this process for the bucket of *uri*, or None."""
    found = bucket_of(uri)
    if found is None:
        return None
    with _lock:
        options = _installed.get(found)
    return dict(options) if options is not None else None


def for_delta(uri: str, given: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The ``storage_options`` to give delta-rs for *uri*: the installed ones, with *given*
    over them; None when neither has any (delta-rs then reads the environment)."""
    merged = {**(installed_for(uri) or {}), **(given or {})}
    return merged or None


def option(options: Mapping[str, str], *names: str) -> str | None:
    """The value of the first of *names* in *options*, whatever the keys' case."""
    lowered = {k.lower(): v for k, v in options.items()}
    for name in names:
        if name in lowered:
            return lowered[name]
    return None
