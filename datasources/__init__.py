"""The Spark DataSource classes of spark-ckpt: ``ckpt-source`` (:mod:`.ckpt_source`),
``ckpt-sink`` (:mod:`.ckpt_sink`) and ``ckpt-state`` (:mod:`.ckpt_state`). Each hook is a few
lines calling :mod:`spark_ckpt.spark.datasource`; :func:`spark_ckpt.register_data_sources`
registers them with a session.
"""
