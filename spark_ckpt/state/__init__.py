"""Keyed and operator state: descriptors, the state backend (registration, vectorized
access), its snapshot strategy (full and incremental) and restore/rescale by key groups,
timers kept as keyed state, state TTL, and the narrow handle an operator receives.

Modules: :mod:`~spark_ckpt.state.keygroup` (key groups and their hash),
:mod:`~spark_ckpt.state.descriptor` (descriptors, blob schemas and metadata),
:mod:`~spark_ckpt.state.operator_state` (operator list state),
:mod:`~spark_ckpt.state.backend` (``KeyedStateBackend``: registration, per-record and
vectorized access), :mod:`~spark_ckpt.state.snapshot` (change log, full and incremental
snapshots), :mod:`~spark_ckpt.state.state_restore` (restore and rescale by key groups),
:mod:`~spark_ckpt.state.timers` (an operator's timers, as keyed state),
:mod:`~spark_ckpt.state.ttl` (states that expire) and
:mod:`~spark_ckpt.state.context` (``StateContext``, what operators see).

Pure core: imports :mod:`spark_ckpt.protocol` only, never ``pyspark`` or ``deltalake``.
"""
