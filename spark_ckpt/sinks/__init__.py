"""Two-phase-commit sinks: the transactional sink contract, the sink ledger that cuts a
micro-batch's output at barriers, and the in-memory sink. The Delta writer and committer are
adapters in :mod:`spark_ckpt.delta`. Pure core: no ``pyspark``, no ``deltalake``.
"""
