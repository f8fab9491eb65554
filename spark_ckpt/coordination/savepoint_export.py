"""Finding the self-contained copy of a savepoint a pipeline took.

The coordinator host exports a completed savepoint into its directory
(:func:`~spark_ckpt.delta.savepoint.export_savepoint`) right after its completion and sink
commit; clients (:class:`~spark_ckpt.client.pipeline_client.PipelineClient`, a stopping
:class:`~spark_ckpt.pipeline.pipeline_run.PipelineRun`) wait here until the copy is complete.
The path is determined by the savepoint's properties (directory, pipeline) and id.
"""

from __future__ import annotations

import time

from spark_ckpt.delta.savepoint import (
    Savepoint,
    open_savepoint,
    savepoint_directory,
    savepoint_path,
)
from spark_ckpt.errors import CheckpointError, RestoreError, StoreError
from spark_ckpt.protocol.checkpoint import CompletedCheckpoint
from spark_ckpt.runtime.restore_settings import PIPELINE

POLL_S = 0.2


def exported_path(root: str, checkpoint: CompletedCheckpoint) -> str:
    """Where the savepoint *checkpoint* of the root *root* is (or will be) exported."""
    directory = savepoint_directory(root, checkpoint)
    return savepoint_path(
        directory, checkpoint.properties.get(PIPELINE, ""), checkpoint.checkpoint_id
    )


def wait_exported(root: str, checkpoint: CompletedCheckpoint, timeout_s: float) -> Savepoint:
    """The exported copy of the savepoint *checkpoint*, once complete; raises
    :class:`CheckpointError` if it is not within *timeout_s*."""
    path = exported_path(root, checkpoint)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return open_savepoint(path)[1]
        except (RestoreError, StoreError) as e:
            if time.monotonic() >= deadline:
                raise CheckpointError(
                    f"savepoint {checkpoint.checkpoint_id} completed but its copy at {path} "
                    f"was not written within {timeout_s:g} s: {e}"
                ) from e
        time.sleep(POLL_S)
