"""Messages between Spark's separate processes, through the pipeline's store root.

In Spark the coordinator lives in the source runner (a long-lived driver-side process), while
the tasks that acknowledge checkpoints run elsewhere: the foreachBatch aligner in the user's
driver process, the ``ckpt-sink`` committer in a fresh process per micro-batch; savepoint and
stop requests come from notebooks and the CLI. They talk through files under the pipeline
root, which works the same on a laptop and on a cluster's shared storage:

* ``_mailbox/`` — a queue of JSON messages to the coordinator (:class:`Mailbox`): acks,
  declines, checkpoint/savepoint/stop/pause/resume requests. A message is written to a temporary
  name and renamed into place, so readers never see half a message. Names sort by posting time.
  Delivery is at-least-once: the coordinator deletes a message after acting on it, and acting twice
  is harmless (a duplicate ack is answered ``DUPLICATE``, a request carries an id). A run of a
  pipeline (one attempt of :meth:`Pipeline.run <spark_ckpt.pipeline.pipeline.Pipeline.run>`) has a
  box of its own, ``_mailbox/<run id>/``, for its tasks' acks and declines, so that a second driver
  on the same root never consumes them. Requests from clients go to the shared box; every request
  carries an expiry (a client that gave up waiting does not leave a ``stop`` for a later run), and a
  malformed file is moved to ``_mailbox/_rejected/`` with a warning instead of failing every poll.
* the topology — who acknowledges checkpoints — is :mod:`spark_ckpt.coordination.topology`;
* ``_mailbox/_alive/`` — who would answer a request
  (:class:`~spark_ckpt.coordination.heartbeats.Heartbeats`): a record per running coordinator,
  rewritten every :data:`HEARTBEAT_INTERVAL_S` by a thread of its own
  (:class:`~spark_ckpt.coordination.heartbeats.HeartbeatThread`, started with the coordinator's
  polling, removed when it stops), and a record per starting run, written by its driver before the
  query starts (the coordinator's record of that run replaces it). A record is live while fresh (its
  writer says for how long) and, on the reader's own host, while its writer's process exists: a run
  that was killed is not live, at once on its host, elsewhere once its record went stale (clocks of
  the hosts are assumed to agree within seconds). A client posts a request only while a record is
  live (:meth:`PipelineClient.request <spark_ckpt.client.pipeline_client.PipelineClient.request>`):
  a request to a root where nothing runs fails at once instead of waiting for its timeout, and
  leaves nothing behind.

Completion is not messaged back: tasks read completed checkpoints from the checkpoint store.
"""

from __future__ import annotations

import json
import logging
import time
import uuid

import pyarrow.fs as pafs

from spark_ckpt.coordination.messages import Message, decode_message
from spark_ckpt.coordination.root_files import remove_dir
from spark_ckpt.errors import ProtocolError, StoreError
from spark_ckpt.locations.objects import write_whole
from spark_ckpt.locations.uris import filesystem

log = logging.getLogger(__name__)

MAILBOX_DIR = "_mailbox"
#: Where malformed mailbox files are set aside (under the mailbox directory).
REJECTED_DIR = "_rejected"

#: Listings of the mailbox retried when an entry vanishes while it is read.
_LIST_ATTEMPTS = 5


class Mailbox:
    """The coordinator's inbox under *root* (the pipeline root): the shared box, or the box
    of run *box* (``_mailbox/<box>/``)."""

    def __init__(self, root: str, box: str | None = None) -> None:
        self._fs, base = filesystem(root)
        self._dir = f"{base.rstrip('/')}/{MAILBOX_DIR}" + (f"/{box}" if box else "")
        self._rejected = f"{base.rstrip('/')}/{MAILBOX_DIR}/{REJECTED_DIR}"

    def post(self, message: Message) -> str:
        """Post *message*; returns its name. Safe from any process."""
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex}.json"
        write_whole(self._fs, f"{self._dir}/{name}", json.dumps(message.to_dict()).encode())
        return name

    def receive(self) -> list[tuple[str, Message]]:
        """Every well-formed message present, oldest first. A file that is not a message
        (unparsable JSON, unknown type, missing fields) is set aside under
        ``_mailbox/_rejected/`` with a warning naming it, never returned again."""
        for attempt in range(_LIST_ATTEMPTS):
            try:
                infos = self._fs.get_file_info(pafs.FileSelector(self._dir, allow_not_found=True))
                break
            except FileNotFoundError as e:
                # a sender's temporary file was renamed into a message while the directory
                # was listed (the listing stats every entry it read): list again
                if attempt == _LIST_ATTEMPTS - 1:
                    raise StoreError(f"cannot list {self._dir}: {e}") from e
            except OSError as e:
                raise StoreError(f"cannot list {self._dir}: {e}") from e
        names = sorted(
            i.base_name
            for i in infos
            if i.base_name.endswith(".json") and i.type is pafs.FileType.File
        )
        out: list[tuple[str, Message]] = []
        for name in names:
            try:
                with self._fs.open_input_stream(f"{self._dir}/{name}") as f:
                    raw = f.read()
            except FileNotFoundError:
                continue  # taken by a concurrent reader
            except OSError as e:
                raise StoreError(f"cannot read message {name}: {e}") from e
            try:
                data = json.loads(raw)
                if not isinstance(data, dict):
                    raise ProtocolError(f"not a JSON object: {type(data).__name__}")
                out.append((name, decode_message(data)))
            except (ProtocolError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError
                self._reject(name, str(e))
        return out

    def _reject(self, name: str, reason: str) -> None:
        log.warning("mailbox: set aside malformed message %s/%s: %s", self._dir, name, reason)
        try:
            self._fs.create_dir(self._rejected, recursive=True)
            self._fs.move(f"{self._dir}/{name}", f"{self._rejected}/{name}")
        except FileNotFoundError:
            pass  # taken by a concurrent reader
        except OSError as e:
            raise StoreError(f"cannot set aside malformed message {name}: {e}") from e

    def holds(self, name: str) -> bool:
        """Whether message *name* is still in the box: not yet taken (the coordinator deletes
        a message once it acted on it)."""
        try:
            info = self._fs.get_file_info(f"{self._dir}/{name}")
        except OSError as e:
            raise StoreError(f"cannot look for message {name}: {e}") from e
        return info.type is pafs.FileType.File

    def rejected(self) -> list[str]:
        """Names of the files set aside as malformed, oldest first."""
        infos = self._fs.get_file_info(pafs.FileSelector(self._rejected, allow_not_found=True))
        return sorted(i.base_name for i in infos)

    def delete(self, names: list[str]) -> None:
        for name in names:
            try:
                self._fs.delete_file(f"{self._dir}/{name}")
            except FileNotFoundError:
                pass
            except OSError as e:
                raise StoreError(f"cannot delete message {name}: {e}") from e

    def remove_box(self) -> None:
        """Delete this box with what it holds (a run's box once the run ended). Idempotent."""
        remove_dir(self._fs, self._dir)
