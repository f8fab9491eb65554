"""The driver placement (``placement="driver"``): the keyed operators run in the
``foreachBatch`` function, in the driver process (under Spark Connect, a server-side process),
behind a barrier aligner, exactly-once into the two-phase-commit sink.
"""
