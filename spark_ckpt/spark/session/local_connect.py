"""The local Spark Connect server of :func:`~spark_ckpt.spark.session.builders.connect_session`
with ``local[N]``: this process's own, reachable from this machine only.

pyspark's ``SparkSession.builder.remote("local[N]")`` starts a Connect server inside the
process (a local Spark with Spark's ``SparkConnectPlugin``) and connects to
``sc://localhost:15002``. The server then listens on **every interface**, on the **fixed**
port 15002: anyone who can reach the machine can run code in that Spark, and a second
process on the host cannot start one (``BindException``). Here the same server is started
the same way (pyspark's ``_start_connect_server``, the routine ``remote("local[N]")``
calls), with three settings of its own:

* ``spark.connect.grpc.binding.address`` is the loopback address :data:`LOOPBACK`;
* ``spark.connect.grpc.binding.port`` is 0: the operating system picks a free port when the
  server starts, read back from the server (``SparkConnectService.localPort``);
* ``spark.connect.authenticate.token`` is the pre-shared token pyspark creates for its local
  server (``SPARK_CONNECT_AUTHENTICATE_TOKEN``, a random UUID, or the user's when set). pyspark
  hands it over in the environment, which a JVM started earlier (a quiet start,
  :mod:`spark_ckpt.spark.session.spark_logs`) never sees; as a setting it always reaches
  the server, so another user of the machine cannot call it without the token either.

The client connects to ``sc://localhost:<port>`` with that token (over gRPC's local
credentials, as pyspark does for ``localhost``). The server stops with the session
(``spark.stop()``), as pyspark's local server does.

To reach a Connect server from other machines, run one of its own, with the address, port,
token and TLS chosen on purpose (``README.md``, *Spark Connect*).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

#: The only address the local server listens on.
LOOPBACK: Final = "127.0.0.1"

#: The environment variables pyspark keeps for its local Connect mode: the token its client
#: sends, and the marks that tell the rest of pyspark the session is a Connect one.
TOKEN_ENV: Final = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
_LOCAL_REMOTE: Final = "SPARK_LOCAL_REMOTE"
_CONNECT_MODE: Final = "SPARK_CONNECT_MODE_ENABLED"

#: The server's settings for a local address, a free port and the token.
ADDRESS_SETTING: Final = "spark.connect.grpc.binding.address"
PORT_SETTING: Final = "spark.connect.grpc.binding.port"
TOKEN_SETTING: Final = "spark.connect.authenticate.token"


def local_connect_url(master: str, settings: Mapping[str, str]) -> str:
    """Start this process's local Connect server for *master* (``local[N]``,
    ``local-cluster[…]``) with the Spark *settings*, listening on :data:`LOOPBACK` on a free
    port, and return the URL a client connects to (``sc://localhost:<port>``). When the
    process already runs its local Connect server, return that one's URL (the settings of
    the first start stay). Runs in the driver's process; starts a JVM when none runs yet.
    Not thread-safe (pyspark's own start is not)."""
    import uuid

    from pyspark.sql import SparkSession as ClassicSession
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    running = ClassicSession._instantiatedSession
    if running is None or running._sc._jsc is None or _LOCAL_REMOTE not in os.environ:
        token = os.environ.get(TOKEN_ENV) or settings.get(TOKEN_SETTING) or str(uuid.uuid4())
        server = {**settings, ADDRESS_SETTING: LOOPBACK, PORT_SETTING: "0", TOKEN_SETTING: token}
        saved = {k: os.environ.get(k) for k in (TOKEN_ENV, _LOCAL_REMOTE)}
        os.environ.update({TOKEN_ENV: token, _LOCAL_REMOTE: "1"})
        try:
            ConnectSession._start_connect_server(master, server)
        except BaseException:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            raise
    os.environ[_CONNECT_MODE] = "1"
    return f"sc://localhost:{server_port()}"


def server_port() -> int:
    """The port this process's local Connect server listens on (it runs)."""
    from pyspark.sql import SparkSession as ClassicSession

    session = ClassicSession._instantiatedSession
    assert session is not None, "no local Connect server runs in this process"
    service = getattr(session._jvm, "org.apache.spark.sql.connect.service.SparkConnectService$")
    return int(getattr(service, "MODULE$").localPort())
