"""Session plumbing: building a local or Spark Connect session with spark-ckpt's defaults
(quiet logs, a Spark home of links to pyspark's own, `PYSPARK_PYTHON`, a local Connect
server on loopback), the environment of the processes spark-ckpt starts, silencing the log
lines a query stop causes, and SQL settings that hold for one query.
"""
