"""Checkpoint storage contract and the in-memory store.

The contract has two views, as in Flink: what the coordinator uses (id leases, commit, list,
retain/discard) and what a task uses (write and read state blobs). The Delta implementation
is an adapter in :mod:`spark_ckpt.delta`. Pure core: no ``pyspark``, no ``deltalake``.
"""
