"""Channel sources: the contract of an ordered, replayable channel per source split, the
stream offsets Spark logs (with barrier positions), the Arrow encoding of data and barrier
rows, and the deterministic generator. The Delta tail source is an adapter in
:mod:`spark_ckpt.delta`. Pure core: no ``pyspark``, no ``deltalake``.
"""
