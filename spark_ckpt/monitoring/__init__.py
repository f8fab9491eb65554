"""The checkpoint page (``spark-ckpt ui``), its JSON API, ``/metrics`` and the notebook view:
a pipeline's checkpoints as people and monitoring systems look at them, read from the
pipeline's root and nothing else."""

from spark_ckpt.monitoring.root_view import RootReader, RootView
from spark_ckpt.monitoring.server import CheckpointServer

__all__ = ["CheckpointServer", "RootReader", "RootView"]
