"""The Spark layer: session plumbing (:mod:`~spark_ckpt.spark.session`), the executor
subtasks (:mod:`~spark_ckpt.spark.executors`), the driver placement
(:mod:`~spark_ckpt.spark.driver`) and what the data sources call
(:mod:`~spark_ckpt.spark.datasource`). Nothing here imports :mod:`datasources`.
"""
