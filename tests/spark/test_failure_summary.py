"""What a failed run reports: the cause in Spark's message, not its first line."""

from __future__ import annotations

import pytest

from spark_ckpt.spark.supervisor import failure_summary as _failure_summary

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
