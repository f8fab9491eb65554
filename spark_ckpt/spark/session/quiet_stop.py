"""Spark's log lines about the tasks that a query stop kills, dropped.

``query.stop()`` on a query whose micro-batch is running cancels its Spark job. Spark then
logs, per killed task, an ``Aborting task`` error with the ``TaskKilledException``'s stack
trace (about 30 lines), the write's abort, and a ``Lost task … TaskKilled`` warning: some 70
lines on the console for what the user asked for. Nothing is lost by stopping: spark-ckpt's
output is committed by checkpoints only, and the killed batch is replayed from the last
completed checkpoint by the next run.

:func:`silence_task_kill_logs` adds one log4j filter to the root logger of the driver's JVM that
drops exactly those messages (matched on the message text, :data:`KILLED_TASK_MESSAGES`); every
other line, including a real task failure's ``Exception in task`` with its trace and the query's own
error, is logged as before. :func:`~spark_ckpt.pipeline.pipeline.register_data_sources` calls it, so
every session that uses spark-ckpt has it. Under Spark Connect the JVM is the server's, out of
reach: nothing is done there.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: The messages dropped (a Java regular expression over the whole message): a killed task's
#: ``Aborting task`` (``Utils``, with the ``TaskKilledException``'s trace), the aborted
#: commit of its partition (``DataWritingSparkTask``), the aborted micro-batch write
#: (``WriteToDataSourceV2Exec``) and the ``Lost task … TaskKilled`` warning
#: (``TaskSetManager``).
KILLED_TASK_MESSAGES = (
    r"(?s)(Aborting task"
    r"|Abort(ing|ed) commit for partition .*"
    r"|Data source write support .* (is aborting|aborted|failed to abort)\."
    r"|.*Lost task .*: TaskKilled \(.*)"
)


def silence_task_kill_logs(spark: SparkSession) -> bool:
    """Drop the log lines of tasks killed by a query stop (see the module docstring) in the
    JVM of the classic session *spark*; idempotent. Returns whether the filter is in place
    (False under Spark Connect, or when log4j is not Spark's log4j 2)."""
    jvm: Any = getattr(spark, "_jvm", None)
    if jvm is None:  # Spark Connect: the server logs
        return False
    try:
        core = jvm.org.apache.logging.log4j.core
        context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
        root = context.getConfiguration().getRootLogger()
        present = root.getFilter()
        if present is not None and KILLED_TASK_MESSAGES in str(present.toString()):
            return True
        result = core.Filter.Result
        regex_filter = core.filter.RegexFilter.createFilter(
            KILLED_TASK_MESSAGES, None, False, result.DENY, result.NEUTRAL
        )
        root.addFilter(regex_filter)
        context.updateLoggers()
        return True
    except Exception as e:  # another logging backend, a JVM without log4j 2 core
        log.debug("cannot filter Spark's killed-task logs: %s", e)
        return False
