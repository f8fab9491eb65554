"""Components a job hands its processes in place of the ones the pipeline builds.

A pipeline builds its checkpoint store, its sink's global committer, its channel source and
runs the user's operators. A job may name a :class:`Components` object
(``components="module:name"``, see :class:`~spark_ckpt.pipeline.job.JobSpec`) whose hooks
receive each of these where it is built and return the one to use: a store with a cache, a
committer that reports each commit, a source wrapped for tracing — or, in the crash tests,
versions that fail on purpose (:mod:`spark_ckpt.testing.faults`). The base class returns
every component unchanged.

The name travels as text (a ``ckpt-source`` option, a field of the picklable aligner spec),
and each process resolves it itself (:func:`load_components`):

============  ========================================================================
hook          where it is called
============  ========================================================================
``store``     the coordinator's process (Spark's source runner), and where the
              subtasks run (the foreachBatch process, or the executors' Python workers)
``committer`` the coordinator's process, for the global sink commit
``source``    the coordinator's process; what it plans is read on the executors
``operator``  the driver, when a run is prepared (the operators ship as they return)
============  ========================================================================

Hooks may run several times in one process and must not keep state across calls; whatever
they return must honour the contract of what they received (an operator keeps its uid).
"""

from __future__ import annotations

import importlib

from spark_ckpt.errors import ConfigError
from spark_ckpt.runtime.operator import KeyedOperator
from spark_ckpt.sinks.two_phase_commit import SinkCommitter
from spark_ckpt.sources.channel_source import ChannelSource
from spark_ckpt.storage.checkpoint_store import CheckpointStore


class Components:
    """Hooks over a pipeline's components (module docstring); each returns what it got."""

    def store(self, store: CheckpointStore, root: str) -> CheckpointStore:
        """The checkpoint store of the pipeline at *root*, for coordinator and tasks."""
        return store

    def committer(self, committer: SinkCommitter, root: str) -> SinkCommitter:
        """The global committer of the pipeline's sink (the coordinator's process)."""
        return committer

    def source(self, source: ChannelSource, root: str) -> ChannelSource:
        """The channel source of a ``ckpt-source`` query (the coordinator's process)."""
        return source

    def operator(self, operator: KeyedOperator, root: str) -> KeyedOperator:
        """A user operator of the job (the driver, before the run ships it)."""
        return operator


#: The components as the pipeline builds them.
DEFAULT = Components()


def load_components(reference: str | None) -> Components:
    """The :class:`Components` named ``module:name`` (a class is instantiated without
    arguments); :data:`DEFAULT` for None or ``""``. :class:`~spark_ckpt.errors.ConfigError`
    for a name that cannot be imported or is not a :class:`Components`."""
    if not reference:
        return DEFAULT
    module, sep, name = reference.strip().partition(":")
    expected = "module:name of a spark_ckpt Components object"
    if not sep or not module or not name:
        raise ConfigError("components", reference, expected)
    try:
        found: object = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as e:
        raise ConfigError("components", reference, f"{expected} ({e})") from None
    if isinstance(found, type) and issubclass(found, Components):
        found = found()
    if not isinstance(found, Components):
        raise ConfigError("components", reference, expected)
    return found
