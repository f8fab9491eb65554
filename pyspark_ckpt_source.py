"""Auto-registration shim: Spark imports top-level ``pyspark_*`` modules and registers their
``DefaultSource`` under its ``name()`` — here ``ckpt-source``."""

from datasources.ckpt_source import CkptSource as DefaultSource

__all__ = ["DefaultSource"]
