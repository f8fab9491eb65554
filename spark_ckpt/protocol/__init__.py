"""The protocol's vocabulary, shared by every layer: checkpoint barriers, the handles of
stored state and the messages a task sends its coordinator (acknowledge/decline), completed
checkpoints, the clock, and option validators.

Bottom layer: imports nothing of spark_ckpt but :mod:`spark_ckpt.errors`, and neither
``pyspark`` nor ``deltalake`` (checked by ``make lint``).
"""
