"""The checkpoint page's HTTP server (``spark-ckpt ui``): the page, its JSON API, its charts
and ``/metrics``, over one pipeline root.

The standard library's ``ThreadingHTTPServer``: a page for a handful of people and a
Prometheus scraper needs no framework. Routes (GET only):

==================================  ==========================================================
``/``                               the page (static HTML, script and style shipped in the
                                    package: it works offline and reads only the routes below)
``/checkpoints``                    counts, summary, latest, history, runs, sources
                                    (:func:`~spark_ckpt.monitoring.documents.checkpoints`)
``/checkpoints/config``             the checkpoint configuration (404 before any run wrote one)
``/checkpoints/details/<id>``       one finished checkpoint with its subtasks (404: not in the
                                    history)
``/charts/duration.svg``,           the charts (:mod:`spark_ckpt.monitoring.charts`)
``/charts/size.svg``
``/metrics``                        Prometheus text (:mod:`spark_ckpt.monitoring.prometheus`)
==================================  ==========================================================

Every route but the static files reads a :class:`~spark_ckpt.monitoring.root_view.RootView`,
shared by the requests of one second (:class:`ViewCache`), so a page load costs one read of
the root however many routes it calls. A read that fails (a damaged history, a store that
went away) answers 503 with ``{"error": ...}``; the page shows that line and tries again.
"""

from __future__ import annotations

import errno
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from spark_ckpt.errors import EnvironmentSetupError, SparkCkptError
from spark_ckpt.monitoring import charts, documents, prometheus
from spark_ckpt.monitoring.root_view import RootReader, RootView

log = logging.getLogger(__name__)

#: How long a read view serves further requests.
VIEW_MAX_AGE_S = 1.0
#: The page's files, shipped as package data.
STATIC = {
    "/": ("page.html", "text/html; charset=utf-8"),
    "/static/page.js": ("page.js", "text/javascript; charset=utf-8"),
    "/static/page.css": ("page.css", "text/css; charset=utf-8"),
}
_DETAILS = re.compile(r"^/checkpoints/details/(\d+)$")


class ViewCache:
    """The view of the root, read again once older than *max_age_s*; thread-safe (one read at
    a time: concurrent requests wait for it and share it)."""

    def __init__(self, reader: RootReader, max_age_s: float = VIEW_MAX_AGE_S) -> None:
        self.reader = reader
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._view: RootView | None = None
        self._at = 0.0

    def get(self) -> RootView:
        with self._lock:
            if self._view is None or time.monotonic() - self._at > self.max_age_s:
                self._view = self.reader.read()
                self._at = time.monotonic()
            return self._view


def page_file(name: str) -> bytes:
    """A file of the page (package data)."""
    return resources.files("spark_ckpt.monitoring").joinpath(name).read_bytes()


class _Handler(BaseHTTPRequestHandler):
    server: CheckpointServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        static = STATIC.get(path)
        if static is not None:
            self._send(HTTPStatus.OK, static[1], page_file(static[0]))
            return
        route = self.server.route(path)
        if route is None:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {path}"})
            return
        try:
            view = self.server.views.get()
        except SparkCkptError as e:
            self._json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": _line(str(e))})
            return
        except Exception as e:  # a bug, or an error not translated: said, not a dead page
            log.exception("reading %s failed", self.server.views.reader.root)
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(e).__name__}: {e}"})
            return
        try:
            route(self, view)
        except Exception as e:  # a bug: said, not a dropped connection
            log.exception("answering %s failed", path)
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(e).__name__}: {e}"})

    def _send(self, status: HTTPStatus, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: HTTPStatus, doc: Any) -> None:
        self._send(status, "application/json", json.dumps(doc).encode())

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


Route = Callable[[_Handler, RootView], None]


def _checkpoints(h: _Handler, view: RootView) -> None:
    h._json(HTTPStatus.OK, documents.checkpoints(view))


def _config(h: _Handler, view: RootView) -> None:
    doc = documents.config(view)
    if doc is None:
        h._json(
            HTTPStatus.NOT_FOUND, {"error": "no run of the pipeline recorded its configuration"}
        )
    else:
        h._json(HTTPStatus.OK, doc)


def _metrics(h: _Handler, view: RootView) -> None:
    h._send(HTTPStatus.OK, prometheus.CONTENT_TYPE, prometheus.exposition(view).encode())


def _chart(draw: Callable[..., str]) -> Route:
    def route(h: _Handler, view: RootView) -> None:
        svg = draw(view.records, view.read_ms if view.running else None)
        h._send(HTTPStatus.OK, "image/svg+xml", svg.encode())

    return route


def _details(checkpoint_id: int) -> Route:
    def route(h: _Handler, view: RootView) -> None:
        doc = documents.details(view, checkpoint_id)
        if doc is None:
            h._json(
                HTTPStatus.NOT_FOUND,
                {"error": f"checkpoint {checkpoint_id} is not in the statistics history"},
            )
        else:
            h._json(HTTPStatus.OK, doc)

    return route


ROUTES: dict[str, Route] = {
    "/checkpoints": _checkpoints,
    "/checkpoints/config": _config,
    "/metrics": _metrics,
    "/charts/duration.svg": _chart(charts.duration_chart),
    "/charts/size.svg": _chart(charts.size_chart),
}


class CheckpointServer(ThreadingHTTPServer):
    """Serves the routes of the module docstring for *reader*'s root on *host*:*port* (port 0:
    any free one; :attr:`url` says which). Raises
    :class:`~spark_ckpt.errors.EnvironmentSetupError` when the port is taken or the address
    cannot be bound."""

    daemon_threads = True

    def __init__(self, reader: RootReader, host: str = "127.0.0.1", port: int = 8082) -> None:
        self.views = ViewCache(reader)
        try:
            super().__init__((host, port), _Handler)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise EnvironmentSetupError(
                    f"port {port} on {host} is in use: choose another with --port "
                    "(0: any free port)"
                ) from None
            raise EnvironmentSetupError(f"cannot listen on {host}:{port}: {e.strerror}") from None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/"

    def route(self, path: str) -> Route | None:
        found = ROUTES.get(path)
        if found is not None:
            return found
        m = _DETAILS.match(path)
        return None if m is None else _details(int(m.group(1)))

    def serve_in_thread(self) -> threading.Thread:
        """Serve on a daemon thread (notebooks, tests); stop with ``shutdown()``."""
        thread = threading.Thread(target=self.serve_forever, name="spark-ckpt-ui", daemon=True)
        thread.start()
        return thread


def _line(text: str) -> str:
    return " ".join(text.split())
