"""The pipeline API, in the user's driver process: a :class:`~spark_ckpt.pipeline.pipeline.Pipeline`
describes a job (source, operators, output), prepares and restores its runs, registers the data
sources and starts the Spark queries; the supervisor restarts failed runs by the restart
strategy and reports their checkpoints. The only package that imports :mod:`datasources`.
"""
