"""A real S3 endpoint for tests and benchmarks: moto in server mode (the dev extra's
``moto[server]``), started on a free port of this host, with its request log.

moto enforces ``If-None-Match`` on PUT, so delta-rs's conditional commits fence a second
writer there as on S3. It keeps everything in memory and accepts any credentials unless
started with ``auth=True`` (moto's IAM checks: the test credentials then resolve to no user,
and every request is denied).

To run against another S3-compatible store instead, set ``AWS_ENDPOINT_URL`` and the
credentials yourself.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Final
from urllib.parse import parse_qs

from spark_ckpt.errors import EnvironmentSetupError
from spark_ckpt.testing.processes import free_port, stop_process, wait_listening

#: A request line of moto's log: ``... "PUT /bucket/key?query HTTP/1.1" 200 -``, its request
#: maybe wrapped in terminal colour codes.
_COLOUR: Final = rb"(?:\x1b\[[0-9;]*m)*"
_REQUEST: Final = re.compile(
    rb'"'
    + _COLOUR
    + rb"(GET|PUT|POST|HEAD|DELETE) (/[^ ?]*)(\?[^ ]*)? HTTP/[0-9.]+"
    + _COLOUR
    + rb'" (\d+)'
)


@dataclass(frozen=True)
class Served:
    """One request the endpoint served: when its log line arrived (epoch seconds), the
    method (``LIST`` for a listing, whose path is then its prefix), the path and the HTTP
    status."""

    time_s: float
    method: str
    path: str
    status: int


def _moto_server() -> str:
    found = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or shutil.which(
        "moto_server"
    )
    if found is None:
        raise EnvironmentSetupError("a test S3 endpoint needs moto: pip install 'spark-ckpt[dev]'")
    return found


class S3Endpoint:
    """A running moto server (see the module docstring); :meth:`stop` ends it. Counts the
    requests it served (:meth:`requests`)."""

    def __init__(self, process: subprocess.Popen[bytes], port: int) -> None:
        self.process = process
        self.port = port
        self._lock = threading.Lock()
        self._requests: list[Served] = []
        assert process.stderr is not None
        self._reader = threading.Thread(target=self._read_log, args=(process.stderr,), daemon=True)
        self._reader.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def environment(self) -> dict[str, str]:
        """The variables that point the AWS SDKs, pyarrow and delta-rs at this endpoint."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def storage_options(self) -> dict[str, str]:
        """The same settings as delta-rs storage options, for a second reader (polars) that
        should not depend on this process's environment."""
        env = self.environment()
        return {
            "aws_endpoint_url": env["AWS_ENDPOINT_URL"],
            "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
            "aws_region": env["AWS_REGION"],
            "aws_allow_http": "true",
        }

    def create_bucket(self, name: str) -> None:
        """Create bucket *name* (a PUT of the bucket, as S3's API has it)."""
        import urllib.request

        request = urllib.request.Request(f"{self.url}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=30) as response:
            if response.status != 200:
                raise EnvironmentSetupError(f"creating bucket {name}: HTTP {response.status}")

    def _read_log(self, stream: IO[bytes]) -> None:
        for line in stream:
            m = _REQUEST.search(line)
            if m is not None:
                method, path = m.group(1).decode(), m.group(2).decode()
                query = parse_qs((m.group(3) or b"").decode().lstrip("?"))
                if method == "GET" and "list-type" in query:  # a listing: of its prefix
                    method = "LIST"
                    path = f"{path.rstrip('/')}/{query.get('prefix', [''])[0]}"
                served = Served(time.time(), method, path, int(m.group(4)))
                with self._lock:
                    self._requests.append(served)

    def requests(self) -> list[Served]:
        """Every request served so far, in order."""
        with self._lock:
            return list(self._requests)

    def stop(self) -> None:
        stop_process(self.process)


def start_s3_endpoint(*, auth: bool = False, timeout_s: float = 60.0) -> S3Endpoint:
    """Start moto's server on a free port of 127.0.0.1 and wait until it answers. *auth*:
    with moto's IAM checks (see the module docstring)."""
    port = free_port()
    env = dict(os.environ)
    if auth:
        env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
    process = subprocess.Popen(
        [_moto_server(), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    endpoint = S3Endpoint(process, port)
    try:
        wait_listening(process, port, "moto_server", timeout_s)
    except EnvironmentSetupError:
        endpoint.stop()
        raise
    return endpoint


@contextmanager
def running_s3_endpoint(*, auth: bool = False) -> Iterator[S3Endpoint]:
    endpoint = start_s3_endpoint(auth=auth)
    try:
        yield endpoint
    finally:
        endpoint.stop()
