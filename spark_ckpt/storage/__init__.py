"""Checkpoint storage: the contracts and the in-memory store.

The contract has two views, as in Flink (:mod:`spark_ckpt.storage.checkpoint_store`): what the
coordinator uses (:class:`~spark_ckpt.storage.checkpoint_store.CheckpointLog`: id leases, commit,
list, retain/discard) and what a task uses
(:class:`~spark_ckpt.storage.checkpoint_store.StateStorage`: write and read state blobs);
:class:`~spark_ckpt.storage.checkpoint_store.CheckpointStore` provides both. Leases live in
:mod:`~spark_ckpt.storage.lease`, the retention rules in :mod:`~spark_ckpt.storage.retention`,
metadata parsing in :mod:`~spark_ckpt.storage.metadata`, the reference store in
:mod:`~spark_ckpt.storage.memory_store`. The Delta implementation is an adapter in
:mod:`spark_ckpt.delta`. Pure core: no ``pyspark``, no ``deltalake``.
"""
