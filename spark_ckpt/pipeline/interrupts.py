"""Ctrl-C while a pipeline runs in the user's driver: the first asks for a graceful stop, the
second stops at once; Py4J's tracebacks of the interrupt are dropped meanwhile."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any


class Interrupts:
    """Ctrl-C while :meth:`Pipeline.run` supervises (main thread only): the first one is
    noted — and *on_interrupt* called at once, on a thread of its own (so that it may print
    while the main thread prints) — and the supervising loop stops the run with a final
    checkpoint at its next poll; a second one raises ``KeyboardInterrupt`` (stop at once).
    Nothing is interrupted in
    between: PySpark's own SIGINT handler cancels every Spark job (failing the micro-batch
    in progress), and a ``KeyboardInterrupt`` raised inside a Py4J call is logged by Py4J
    with its traceback — dropped meanwhile (:func:`_py4j_interrupt_log`), for the second."""

    def __init__(self, on_interrupt: Callable[[], None] | None = None) -> None:
        self.requested = threading.Event()
        self._on_interrupt = on_interrupt
        self._previous: Any = None

    def _on_sigint(self, signum: int, frame: object) -> None:
        self.requested.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the next one is forceful
        if self._on_interrupt is not None:
            threading.Thread(target=self._on_interrupt, name="on-interrupt", daemon=True).start()

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            for name in _PY4J_INTERRUPT_LOGGERS:
                logging.getLogger(name).addFilter(_py4j_interrupt_log)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        for name in _PY4J_INTERRUPT_LOGGERS:
            logging.getLogger(name).removeFilter(_py4j_interrupt_log)


#: Where Py4J logs a KeyboardInterrupt in a call (``logging.exception`` on the root logger)
#: and its failed clean-up of the interrupted connection.
_PY4J_INTERRUPT_LOGGERS = ("", "py4j.clientserver")


def _py4j_interrupt_log(record: logging.LogRecord) -> bool:
    """Logger filter: drops Py4J's logs of a KeyboardInterrupt inside a Py4J call."""
    return record.getMessage() not in (
        "KeyboardInterrupt while sending command.",
        "Exception occurred while shutting down connection",
    )
