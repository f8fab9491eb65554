"""Resolving a location (a local path or an object-store URI) to a pyarrow file system, and
the store's failures as one :class:`~spark_ckpt.errors.StoreError` line.

Credentials and endpoints are a pipeline's explicit storage options where this process has
them installed for the location's bucket (:mod:`spark_ckpt.locations.credentials`: S3 and
Azure; a GCS location takes only the endpoint from them), else the standard environment of
the process (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_PROFILE``,
``AWS_ENDPOINT_URL``, ``AWS_REGION``; ``AZURE_STORAGE_*``; ``GOOGLE_APPLICATION_CREDENTIALS``),
the same variables delta-rs reads. They are never logged: messages name the location and the
endpoint only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from spark_ckpt.errors import SparkCkptError, StoreError
from spark_ckpt.locations.credentials import installed_for, option

#: The URI schemes of object stores (``s3a`` is Hadoop's name for ``s3``).
OBJECT_STORE_SCHEMES: Final = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az"})
#: The schemes pyarrow names otherwise.
_PYARROW_SCHEME: Final = {"s3a": "s3", "gcs": "gs"}


def scheme(uri: str) -> str:
    """The URI scheme of *uri* in lower case; ``""`` for a local path."""
    return urlsplit(uri).scheme.lower() if "://" in uri else ""


def is_remote(uri: str) -> bool:
    """Whether *uri* names an object store (no rename, no append, no ``/proc`` of its
    writers): see :data:`OBJECT_STORE_SCHEMES`."""
    return scheme(uri) in OBJECT_STORE_SCHEMES


def normalized(uri: str) -> str:
    """*uri* as pyarrow and delta-rs resolve it: a local path made absolute, ``s3a://`` as
    ``s3://``, no trailing slash."""
    if "://" not in uri:
        return os.path.abspath(uri)
    head, rest = uri.split("://", 1)
    return f"{_PYARROW_SCHEME.get(head.lower(), head.lower())}://{rest.rstrip('/')}"


def join(uri: str, *parts: str) -> str:
    """*parts* under *uri*, with ``/`` on object stores and the OS separator locally."""
    if "://" in uri:
        return "/".join([uri.rstrip("/"), *parts])
    return os.path.join(uri, *parts)


def sibling(uri: str, name: str) -> str:
    """*name* beside *uri* (in the folder that holds it)."""
    if "://" in uri:
        return f"{uri.rstrip('/').rsplit('/', 1)[0]}/{name}"
    return os.path.join(os.path.dirname(os.path.abspath(uri)), name)


def bucket(uri: str) -> str | None:
    """The bucket (container) of an object-store URI, else None."""
    if not is_remote(uri):
        return None
    return urlsplit(uri).netloc.split("@")[0] or None  # abfss: container@account


_ENDPOINT_KEYS: Final = ("aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint")


def endpoint(uri: str = "") -> str | None:
    """The S3 endpoint for *uri*, for messages: the installed storage options' or this
    process's environment's (``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``); None: the
    store's default."""
    installed = installed_for(uri) if uri else None
    if installed and (found := option(installed, *_ENDPOINT_KEYS)):
        return found
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def _explicit(uri: str, options: dict[str, str]) -> tuple[pafs.FileSystem, str]:
    """The file system of *uri* built from explicit storage *options* (delta-rs's keys)."""
    parts = urlsplit(uri)
    path = f"{parts.netloc}{parts.path}".rstrip("/")
    found = scheme(uri)
    url = option(options, *_ENDPOINT_KEYS)
    endpoint_scheme, _, host = url.partition("://") if url and "://" in url else (None, "", url)
    if found == "s3":
        fs: pafs.FileSystem = pafs.S3FileSystem(
            access_key=option(options, "aws_access_key_id", "access_key_id"),
            secret_key=option(options, "aws_secret_access_key", "secret_access_key"),
            session_token=option(options, "aws_session_token", "session_token", "token"),
            region=option(options, "aws_region", "region", "aws_default_region"),
            endpoint_override=host or None,
            scheme=endpoint_scheme,
            allow_delayed_open=True,
        )
        return fs, path
    if found in ("abfs", "abfss", "az"):
        container, _, account_host = parts.netloc.partition("@")
        account = option(options, "azure_storage_account_name", "account_name") or (
            account_host.split(".")[0] or None
        )
        fs = pafs.AzureFileSystem(
            account_name=account,
            account_key=option(options, "azure_storage_account_key", "account_key", "access_key"),
        )
        return fs, f"{container}{parts.path}".rstrip("/")
    fs, where = pafs.FileSystem.from_uri(_resolvable(uri))  # gs: credentials from the env
    return fs, str(where).rstrip("/")


def _resolvable(uri: str) -> str:
    """*uri* as :func:`filesystem` hands it to pyarrow: :func:`normalized`, and on S3 with
    ``allow_delayed_open`` (a small file is then one PUT when it is closed, not the three
    requests of a multipart upload; a missing bucket shows at the close, which every write
    here checks)."""
    uri = normalized(uri)
    if scheme(uri) == "s3" and "allow_delayed_open" not in uri:
        uri += ("&" if "?" in uri else "?") + "allow_delayed_open=true"
    return uri


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The file system of *uri* and the path in it. Raises :class:`StoreError` naming
    *uri*."""
    with store_errors(uri):
        if "://" in uri:
            installed = installed_for(uri)
            if installed and is_remote(uri):
                return _explicit(normalized(uri), installed)
            fs, path = pafs.FileSystem.from_uri(_resolvable(uri))
            return fs, str(path).rstrip("/")
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    raise AssertionError("unreachable")  # pragma: no cover


#: What the store's error text means, first match wins: (pattern, explanation).
_CAUSES: Final = (
    (
        re.compile(r"NETWORK_CONNECTION|Could not connect|Couldn't connect|resolve host", re.I),
        "cannot reach the endpoint{endpoint}: is it right, and is the store up?",
    ),
    (
        re.compile(r"NO_SUCH_BUCKET|NoSuchBucket|bucket does not exist|ContainerNotFound", re.I),
        "the bucket {bucket!r} does not exist",
    ),
    (
        re.compile(
            r"ACCESS_DENIED|AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|"
            r"HTTP status 40[13]|Forbidden|AuthorizationFailure",
            re.I,
        ),
        "access denied: check the credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
        "AWS_PROFILE or an instance role) and their rights on the bucket",
    ),
    (
        re.compile(r"credentials|No response body", re.I),
        "the store refused the request: are credentials set (AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY, AWS_PROFILE or an instance role)?",
    ),
)


def explain(uri: str, error: BaseException) -> str:
    """One line on why *error* (raised by the store for *uri*) happened."""
    text = str(error)
    where = endpoint(uri)
    for pattern, why in _CAUSES:
        if pattern.search(text):
            name = bucket(uri) or uri.lstrip("/").split("/")[0]  # a path in a store: bucket/key
            return why.format(endpoint=f" {where}" if where else "", bucket=name)
    return text.splitlines()[0] if text else type(error).__name__


@contextmanager
def store_errors(uri: str, doing: str = "open") -> Iterator[None]:
    """Turn the OS and Arrow errors raised in the block for location *uri* into one
    :class:`StoreError` line, ``cannot <doing> <uri>: <why>``; ours pass through."""
    try:
        yield
    except SparkCkptError:
        raise
    except (OSError, pa.ArrowException) as e:
        raise StoreError(f"cannot {doing} {uri}: {explain(uri, e)}") from e
