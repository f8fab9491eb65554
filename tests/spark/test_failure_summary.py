"""What a failed run reports: the cause in Spark's message, not its first line."""

from __future__ import annotations

import pytest

from spark_ckpt.pipeline.failure_summary import failure_summary as _failure_summary

FOREACH = (
    "[STREAM_FAILED] Query q terminated with exception: [FOREACH_BATCH_USER_FUNCTION_ERROR] "
    "Return Message: Traceback (most recent call last):\n"
    '  File "op.py", line 3, in process_batch\n'
    "{last}\n SQLSTATE: 39000\norg.apache.spark.SparkException: wrapped\n"
    "Caused by: py4j.Py4JException: proxy"
)


@pytest.mark.parametrize(
    ("message", "summary"),
    [
        (FOREACH.format(last="ValueError: bad row"), "ValueError: bad row"),
        (
            FOREACH.format(last="spark_ckpt.testing.faults.InjectedFault: injected fault operator"),
            "InjectedFault: injected fault operator",
        ),
        (
            FOREACH.format(last="spark_ckpt.errors.StoreError: disk full\nValueError: later"),
            "StoreError: disk full",
        ),
        (  # an executor's Python error, and the query's description after it
            "[STREAM_FAILED] Query [id = 1] terminated with exception: [PYTHON_EXCEPTION] An "
            "exception was thrown from the Python worker: Traceback (most recent call last):\n"
            '  File "op.py", line 3, in process_batch\nRuntimeError: injected boom\n'
            " SQLSTATE: 38000 SQLSTATE: XXKST\n=== Streaming Query ===\n"
            "Identifier: q-11b82c [id = 1, runId = 2]\nCurrent State: ACTIVE",
            "RuntimeError: injected boom",
        ),
        (
            "[STREAM_FAILED] Connection reset SQLSTATE: XXKST",
            "[STREAM_FAILED] Connection reset SQLSTATE: XXKST",
        ),
    ],
)
def test_the_summary_names_the_cause(message: str, summary: str) -> None:
    assert _failure_summary(Exception(message)) == summary


class _JvmError(Exception):
    """As pyspark's captured StreamingQueryException: the message, and the JVM stack trace
    kept beside it."""

    def __init__(self, message: str, trace: str) -> None:
        super().__init__(message)
        self._stackTrace = trace


def test_a_dead_source_runner_is_named() -> None:
    # what Spark 4.2 says when the source runner's process is killed: no cause at all
    message = (
        "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception:  SQLSTATE: XXKST"
        "\n=== Streaming Query ===\nIdentifier: q [id = 1, runId = 2]"
    )
    trace = (
        "java.io.EOFException\n\tat java.base/java.io.DataInputStream.readInt(Data"
        "InputStream.java:386)\n\tat org.apache.spark.sql.execution.python.streaming."
        "PythonStreamingSourceRunner.latestOffset(PythonStreamingSourceRunner.scala:235)\n"
    )
    summary = _failure_summary(_JvmError(message, trace))
    assert "source runner" in summary and "ended unexpectedly" in summary
    assert "EOFException in PythonStreamingSourceRunner.latestOffset" in summary
    # a Python error raised in the source runner is named as before, not as its death
    raised = message.replace("exception:  SQLSTATE", "exception: x\nValueError: bad offset\n")
    assert _failure_summary(_JvmError(raised, trace)) == "ValueError: bad offset"
    # other failures without a cause keep the message's first line
    other = _JvmError("[STREAM_FAILED] Connection reset", "java.io.IOException: reset\n")
    assert _failure_summary(other) == "[STREAM_FAILED] Connection reset"
