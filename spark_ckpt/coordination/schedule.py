"""Whether a pipeline's periodic checkpoints are paused: ``<root>/_schedule.json``.

A client pauses them with a ``pause`` request (:meth:`PipelineClient.pause_checkpoints
<spark_ckpt.client.pipeline_client.PipelineClient.pause_checkpoints>`, CLI ``spark-ckpt checkpoints
pause``) and resumes them with a ``resume`` request. The running
coordinator acts on either (:class:`~spark_ckpt.coordination.host.CoordinatorHost`): it writes or
removes this file, then stops or restarts its periodic trigger, as Flink's checkpoint
coordinator stops and starts its checkpoint scheduler. While paused, manual checkpoints,
savepoints and stops work as before, and a checkpoint already under way completes.

The file outlives the run: a coordinator that starts (the next run of ``Pipeline.run``, a
restart after a failure, a new driver) reads it and starts paused, so a pause holds until
someone resumes. Only coordinators write it; clients read it
(:meth:`PipelineClient.checkpoints_paused
<spark_ckpt.client.pipeline_client.PipelineClient.checkpoints_paused>`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from spark_ckpt.errors import StoreError
from spark_ckpt.locations.objects import read_json, write_whole
from spark_ckpt.locations.uris import filesystem

SCHEDULE_FILE = "_schedule.json"


@dataclass(frozen=True)
class SchedulePause:
    """Periodic checkpoints are paused: since *since_ms* (epoch ms), by request
    *request_id*."""

    request_id: str
    since_ms: int

    def to_dict(self) -> dict[str, Any]:
        return {"paused": True, "request_id": self.request_id, "since_ms": self.since_ms}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> SchedulePause:
        return SchedulePause(str(d["request_id"]), int(d["since_ms"]))


class CheckpointSchedule:
    """The pause record of the pipeline under *root* (see the module docstring)."""

    def __init__(self, root: str) -> None:
        self._fs, base = filesystem(root)
        self._path = f"{base.rstrip('/')}/{SCHEDULE_FILE}"

    def paused(self) -> SchedulePause | None:
        """The pause in force, None when periodic checkpoints run. Raises
        :class:`~spark_ckpt.errors.StoreError` when the record cannot be read or decoded."""
        try:
            data = read_json(self._fs, self._path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise StoreError(f"cannot read {self._path}: {e}") from e
        try:
            return SchedulePause.from_dict(data)
        except (KeyError, TypeError, ValueError) as e:
            raise StoreError(f"malformed {self._path}: {e!r}") from e

    def pause(self, pause: SchedulePause) -> None:
        """Coordinator side: record *pause* (replaces an earlier one)."""
        write_whole(self._fs, self._path, json.dumps(pause.to_dict()).encode())

    def resume(self) -> None:
        """Coordinator side: remove the pause record. Idempotent."""
        try:
            self._fs.delete_file(self._path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StoreError(f"cannot delete {self._path}: {e}") from e
