"""Auto-registration shim: Spark imports top-level ``pyspark_*`` modules and registers their
``DefaultSource`` under its ``name()`` — here ``ckpt-state``."""

from datasources.ckpt_state import CkptStateSource as DefaultSource

__all__ = ["DefaultSource"]
