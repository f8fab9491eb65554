"""``test_local_connect.py``'s job, as a script: ``connect_session("local[1]")`` starts this
process's own local Connect server, then a pipeline runs on it while the other script's
server runs too::

    python tests/integration/local_connect_job.py WORKDIR NAME OTHER

It writes ``WORKDIR/NAME.json`` (its server's port and the addresses that port listens on,
read from the kernel's socket tables) once its server is up, waits for ``OTHER.json``,
runs the generator → running count → Delta pipeline (``Trigger.AvailableNow``) into
``WORKDIR/NAME-out``, checks that a client without the server's token is refused and that
the machine's other addresses refuse a connection to the port, writes
``WORKDIR/NAME-done.json``, and stops its session only once ``OTHER-done.json`` exists: the
two servers and their pipelines overlap."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from spark_ckpt import CheckpointConfig, Pipeline, RunningCount, connect_session
from spark_ckpt.spark.session.local_connect import TOKEN_ENV, server_port
from spark_ckpt.testing.sockets import listening_addresses

SOURCE = {"source": "generator", "channels": 2, "rate": 0, "backlog": 400, "keys": 30}
WAIT_S = 300.0
#: Linux's ioctl that reads an interface's IPv4 address.
SIOCGIFADDR = 0x8915


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.2)


def refused_without_token(port: int) -> str:
    """What a Connect client without the token gets from the server (its error's last
    line), or ``"accepted"``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_")}
    env.pop(TOKEN_ENV, None)
    code = (
        "from pyspark.sql.connect.session import SparkSession as S\n"
        f"print(S.builder.remote('sc://localhost:{port}').getOrCreate().range(2).count())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    return "accepted" if done.returncode == 0 else done.stderr


def other_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback: those of its network interfaces
    (Linux's ``SIOCGIFADDR``)."""
    found = set()
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
            except OSError:
                continue  # no IPv4 address
            address = socket.inet_ntoa(reply[20:24])
            if not address.startswith("127."):
                found.add(address)
    return sorted(found)


def refused(address: str, port: int) -> bool:
    """Whether a TCP connection to *address*:*port* fails."""
    try:
        socket.create_connection((address, port), timeout=5).close()
    except OSError:
        return True
    return False


def main(argv: list[str]) -> int:
    workdir, name, other = Path(argv[0]), argv[1], argv[2]
    spark = connect_session("local[1]", f"local-connect-{name}")
    try:
        port = server_port()
        ready = {"port": port, "addresses": sorted(listening_addresses(port))}
        (workdir / f"{name}.json").write_text(json.dumps(ready))
        wait_for(workdir / f"{other}.json")
        config = CheckpointConfig.from_options({"checkpoint.interval": "300ms"})
        result = Pipeline(spark, name, config=config, root=str(workdir / f"{name}-root")).run(
            SOURCE,
            RunningCount("counter", "user_id"),
            output=str(workdir / f"{name}-out"),
            available_now=True,
        )
        refusal = refused_without_token(port)
        done = {
            "restarts": result.restarts,
            "failures": len(result.failures),
            "refusal": refusal[-2000:],
            "elsewhere": {a: refused(a, port) for a in other_addresses()},
            "other_listening": sorted(
                listening_addresses(json.loads((workdir / f"{other}.json").read_text())["port"])
            ),
        }
        (workdir / f"{name}-done.json").write_text(json.dumps(done))
        wait_for(workdir / f"{other}-done.json")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
