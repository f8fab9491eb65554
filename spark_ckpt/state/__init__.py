"""Keyed and operator state: descriptors, the state backend (registration, vectorized
access), its snapshot strategy (full and incremental) and restore/rescale by key groups, and
the narrow handle an operator receives.

Pure core: imports :mod:`spark_ckpt.protocol` only, never ``pyspark`` or ``deltalake``.
"""
