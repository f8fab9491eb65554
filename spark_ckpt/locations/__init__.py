"""Locations: where spark-ckpt's files live, a local path or an object-store URI (``s3://``,
``s3a://``, ``gs://``, ``abfss://``), on every side of the wire alike.

:mod:`~spark_ckpt.locations.uris` resolves a location to a pyarrow file system (credentials
and endpoints from the standard environment) and turns the store's failures into one
:class:`~spark_ckpt.errors.StoreError` line naming the location;
:mod:`~spark_ckpt.locations.preflight` checks a location before anything runs;
:mod:`~spark_ckpt.locations.objects` writes a file that readers see whole or not at all.
Pure core: pyarrow only.
"""
