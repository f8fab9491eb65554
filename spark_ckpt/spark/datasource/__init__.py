"""What the DataSource classes of :mod:`datasources` call: the options of ``ckpt-source`` and
``ckpt-sink`` parsed in one place, the stream reader's work in the source runner (offsets,
barriers, partitions, reads), the inner sources it opens, and ``ckpt-state`` frames.
"""
