"""Stopping a pipeline prints no stack trace: a micro-batch interrupted by ``query.stop()``
fails with a short error Spark recognises as the stop's own interruption, and Ctrl-C during
:meth:`Pipeline.run` raises nothing inside a Py4J call."""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import sys
import traceback
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError

from spark_ckpt.pipeline.interrupts import Interrupts as _Interrupts
from spark_ckpt.spark.driver.batch_aligner import BatchInterruptedError, collect_arrow

#: Spark's StreamExecution.PROXY_ERROR (isInterruptionException), which recurses once per
#: character after its prefix: a long message overflows the JVM stream thread's stack.
PROXY_ERROR = re.compile(
    r"py4j.protocol.Py4JJavaError: An error occurred while calling((.|\r\n|\r|\n)*)"
    r"(java.lang.InterruptedException|java.io.InterruptedIOException|"
    r"java.nio.channels.ClosedByInterruptException)"
)


class FakeThrowable:
    _target_id = "o1"

    def __init__(self, text: str, cause: FakeThrowable | None = None) -> None:
        self.text, self.cause = text, cause

    def toString(self) -> str:
        return self.text

    def getCause(self) -> FakeThrowable | None:
        return self.cause


class FakeFrame:
    def __init__(self, error: Py4JJavaError) -> None:
        self.error = error

    def toArrow(self) -> Any:
        raise self.error


class LongPy4JJavaError(Py4JJavaError):
    def __str__(self) -> str:  # what py4j renders: every Java stack trace
        return self.errmsg + "\tat org.apache.spark.Foo.bar(Foo.scala:1)\n" * 500


def _python_side_text(error: BaseException) -> str:
    """What py4j sends the JVM for a failed callback: the formatted traceback."""
    return "".join(traceback.format_exception(error))


def _raised(df: FakeFrame) -> BaseException:
    try:
        collect_arrow(df)
    except BaseException as e:
        return e
    raise AssertionError("collect_arrow did not raise")


@pytest.mark.parametrize(
    ("java", "check"),
    [
        (
            FakeThrowable("java.lang.InterruptedException"),
            lambda text: PROXY_ERROR.search(text) is not None,
        ),
        (
            FakeThrowable(
                "org.apache.spark.SparkException: Exception thrown in awaitResult: ",
                FakeThrowable(
                    "org.apache.spark.SparkException: [SPARK_JOB_CANCELLED] Job 1 cancelled "
                    "Query q [id = i, runId = job-group-7] was stopped SQLSTATE: XXKDA"
                ),
            ),
            lambda text: (
                "org.apache.spark.SparkException" in text
                and "cancelled" in text
                and "job-group-7" in text
            ),
        ),
    ],
)
def test_an_interrupted_collect_fails_with_a_short_error_spark_recognises(
    java: FakeThrowable, check: Any
) -> None:
    error = _raised(FakeFrame(LongPy4JJavaError("An error occurred while calling o7.x.\n", java)))
    assert isinstance(error, BatchInterruptedError)
    text = _python_side_text(error)
    assert check(text)
    assert "Foo.scala" not in text  # no Java stack trace, no chained Py4J error
    start = text.index("py4j.protocol.Py4JJavaError: An error occurred while calling")
    assert len(text) - start < 800  # short: Spark's regex recurses once per character


def test_other_collect_errors_are_raised_unchanged() -> None:
    original = LongPy4JJavaError(
        "An error occurred while calling o7.x.\n", FakeThrowable("java.lang.OutOfMemoryError")
    )
    assert _raised(FakeFrame(original)) is original


def test_py4j_does_not_log_an_interrupted_batch(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("py4j.clientserver")
    for error in (BatchInterruptedError("stopped"), ValueError("a real failure")):
        try:
            raise error
        except Exception:
            logger.exception("There was an exception while executing the Python Proxy")
    assert [r.exc_info[1] for r in caplog.records if r.exc_info] == [error]


def test_first_ctrl_c_asks_for_a_stop_second_raises_without_py4j_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = signal.getsignal(signal.SIGINT)
    with _Interrupts() as interrupts:
        signal.raise_signal(signal.SIGINT)
        assert interrupts.requested.is_set()
        with pytest.raises(KeyboardInterrupt):
            try:
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt:  # what py4j does in send_command
                logging.exception("KeyboardInterrupt while sending command.")
                logging.getLogger("py4j.clientserver").exception(
                    "Exception occurred while shutting down connection"
                )
                raise
    assert signal.getsignal(signal.SIGINT) is before
    assert caplog.records == []


#: The shape of Spark's source runner loop (python_streaming_source_runner.main): read a
#: function id, ``reader.stop()`` in a ``finally``, then print the exception and exit(-1).
RUNNER = """
import sys, traceback
from spark_ckpt.coordination.host_thread import exit_quietly_if_channel_closed
def read_int():
    raise {error}("channel")
try:
    try:
        read_int()
    finally:
        exit_quietly_if_channel_closed()
except BaseException:
    print(traceback.format_exc(), file=sys.stderr)
    sys.exit(-1)
"""


@pytest.mark.parametrize(
    ("error", "status", "traced"), [("EOFError", 0, False), ("ValueError", 255, True)]
)
def test_a_source_runner_whose_channel_closed_exits_without_a_trace(
    error: str, status: int, traced: bool
) -> None:
    """Spark stops a source runner by closing its socket; the runner's end-of-file must not
    reach the console as a stack trace. Any other error still does."""
    done = subprocess.run(
        [sys.executable, "-c", RUNNER.format(error=error)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == status, done.stderr
    assert ("Traceback (most recent call last)" in done.stderr) == traced, done.stderr
