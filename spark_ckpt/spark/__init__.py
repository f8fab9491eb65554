"""The Spark layer: the pipeline and its client, the foreachBatch function (a picklable
spec that builds its runtime in the process that calls it), the coordinator host that runs in
the source runner, the file mailbox and run files through which they talk, and session
helpers. The ``datasources`` package holds the thin DataSource classes that call into it.
"""
