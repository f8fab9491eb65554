"""The user-facing cause of a failed run, read from what Spark reports: the last error of
spark-ckpt's own in a Python traceback, or the death of Spark's source runner."""

from __future__ import annotations

import re

#: The last line of a Python traceback: ``module.path.ErrorName: message``.
_PYTHON_ERROR = re.compile(r"^((?:[a-z_]\w*\.)*)([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*): (.*)$")


#: A frame of Spark's driver side of the source runner (``PythonStreamingSourceRunner``).
_RUNNER_FRAME = re.compile(r"PythonStreamingSourceRunner\.(\w+)")
#: A Java exception line of a stack trace (``java.io.EOFException``, ``Caused by: …``).
_JAVA_ERROR = re.compile(
    r"^(?:Caused by: )?(?:[a-z_$][\w$]*\.)+([A-Z][\w$]*(?:Exception|Error))\b", re.MULTILINE
)


def failure_summary(error: BaseException, limit: int = 500) -> str:
    """The user-facing cause of a failed query, from Spark's message (a foreachBatch or
    data source error carries the Python traceback): the last error of spark-ckpt's own
    (``spark_ckpt.*``: what a user operator's failure or an injected fault is wrapped in is
    not, so the last Python error line otherwise); else, when Spark's source runner died (its
    message then names no cause, only the query), that; else the message's first line. The
    query's description that Spark appends (``=== Streaming Query ===``, ``Identifier: …``,
    the plan) is not part of the cause."""
    text = str(error).split("\n=== Streaming Query ===", 1)[0]
    lines = [m for line in text.splitlines() if (m := _PYTHON_ERROR.match(line))]
    ours = [m for m in lines if m.group(1).startswith("spark_ckpt.")]
    python = [m for m in lines if not m.group(1).startswith(("org.", "java.", "scala."))]
    candidates = ours or python
    if not candidates:
        runner = _source_runner_died(error)
        if runner is not None:
            return runner[:limit]
        return (text.splitlines()[0] if text else repr(error))[:limit]
    return f"{candidates[-1].group(2)}: {candidates[-1].group(3)}"[:limit]


def _source_runner_died(error: BaseException) -> str | None:
    """What failed when the JVM lost Spark's Python source runner (the process running the
    source's ``latestOffset``, ``partitions`` and ``commit``: killed, out of memory): read
    from the JVM stack trace pyspark keeps with the error. None for any other failure."""
    trace = str(getattr(error, "_stackTrace", None) or "")
    frame = _RUNNER_FRAME.search(trace)
    if frame is None:
        return None
    java = _JAVA_ERROR.search(trace)
    how = java.group(1) if java else "an error"
    return (
        "Spark's Python source runner (the process running the source's latestOffset, "
        f"partitions and commit) ended unexpectedly: {how} in "
        f"PythonStreamingSourceRunner.{frame.group(1)}"
    )
