"""Auto-registration shim: Spark imports top-level ``pyspark_*`` modules and registers their
``DefaultSource`` under its ``name()`` — here ``ckpt-sink``."""

from datasources.ckpt_sink import CkptSink as DefaultSource

__all__ = ["DefaultSource"]
