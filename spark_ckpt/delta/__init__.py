"""Delta Lake adapters (``deltalake``, delta-rs): the checkpoint store, the
two-phase-commit sink (writer and committer) and the tailing source. Delta errors are
translated into :mod:`spark_ckpt.errors` here, at the boundary. No ``pyspark``.
"""
