"""The protocol runtime: the checkpoint coordinator with pending checkpoints, failure
manager and restart strategies, the configuration, the barrier aligner (aligned, unaligned,
at-least-once), and the operator task that snapshots state and acknowledges.

Pure core: imports protocol, state, storage, sinks and sources contracts; never ``pyspark``
or ``deltalake`` (checked by ``make lint``).
"""
