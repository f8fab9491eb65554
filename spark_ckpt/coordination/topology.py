"""Who acknowledges a run's checkpoints, and which sink its coordinator commits:
``_runs/<run id>/topology.json`` (a run's, written by its driver before the query starts and
read by that run's coordinator only), or ``_topology.json`` (the root's shared one, written by
a ``ckpt-sink`` query when it starts and re-read by its coordinator on every poll)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from spark_ckpt.coordination.root_files import RUNS_DIR
from spark_ckpt.errors import ProtocolError, StoreError
from spark_ckpt.locations.objects import read_json, write_whole
from spark_ckpt.locations.uris import filesystem

TOPOLOGY_FILE = "_topology.json"


@dataclass(frozen=True)
class SinkSpec:
    """Where the consumer's transactional output goes (committed by the coordinator)."""

    kind: str  # "delta"
    path: str
    sink_uid: str
    options: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path": self.path,
            "sink_uid": self.sink_uid,
            "options": self.options,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> SinkSpec:
        return SinkSpec(
            str(d["kind"]), str(d["path"]), str(d["sink_uid"]), dict(d.get("options", {}))
        )


@dataclass(frozen=True)
class Topology:
    """The tasks that acknowledge checkpoints: subtasks ``0..parallelism-1`` of ``vertex``,
    and those of each later stage (``stages``).
    ``sink`` (and ``late_sink``, the table of the rows dropped as late, and ``side_sinks``,
    the tables of the operators' named outputs) is committed by the coordinator when a
    checkpoint completes."""

    vertex: str
    parallelism: int
    sink: SinkSpec | None = None
    run_id: str = ""
    late_sink: SinkSpec | None = None
    side_sinks: tuple[tuple[str, SinkSpec], ...] = ()
    #: the job's later stages (several keyed stages): each one's vertex and parallelism
    stages: tuple[tuple[str, int], ...] = ()
    #: several keyed stages: each stage's name, by vertex (the first stage's included)
    stage_names: tuple[tuple[str, str], ...] = ()

    @property
    def tasks(self) -> list[tuple[str, int]]:
        """(vertex, subtask) of every task that acknowledges a checkpoint, stage by stage."""
        vertices = [(self.vertex, self.parallelism), *self.stages]
        return [(v, s) for v, p in vertices for s in range(p)]

    def to_dict(self) -> dict[str, Any]:
        d = {
            "vertex": self.vertex,
            "parallelism": self.parallelism,
            "sink": self.sink.to_dict() if self.sink else None,
            "run_id": self.run_id,
        }
        if self.late_sink is not None:
            d["late_sink"] = self.late_sink.to_dict()
        if self.side_sinks:
            d["side_sinks"] = {name: spec.to_dict() for name, spec in self.side_sinks}
        if self.stages:
            d["stages"] = [[v, p] for v, p in self.stages]
        if self.stage_names:
            d["stage_names"] = dict(self.stage_names)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Topology:
        try:
            sink, late = d.get("sink"), d.get("late_sink")
            return Topology(
                str(d["vertex"]),
                int(d["parallelism"]),
                SinkSpec.from_dict(sink) if sink else None,
                str(d.get("run_id", "")),
                SinkSpec.from_dict(late) if late else None,
                tuple(
                    (str(n), SinkSpec.from_dict(s))
                    for n, s in dict(d.get("side_sinks", {})).items()
                ),
                tuple((str(v), int(p)) for v, p in d.get("stages", [])),
                tuple((str(v), str(n)) for v, n in dict(d.get("stage_names", {})).items()),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"malformed topology: {e}") from e


def _topology_path(base: str, run_id: str | None) -> str:
    base = base.rstrip("/")
    return f"{base}/{RUNS_DIR}/{run_id}/topology.json" if run_id else f"{base}/{TOPOLOGY_FILE}"


def write_topology(root: str, topology: Topology, run_id: str | None = None) -> None:
    """Publish *topology*: the root's shared one, or that of run *run_id*."""
    fs, base = filesystem(root)
    write_whole(fs, _topology_path(base, run_id), json.dumps(topology.to_dict()).encode())


def read_topology(root: str, run_id: str | None = None) -> Topology | None:
    """The root's shared topology, or that of run *run_id*; None when absent."""
    fs, base = filesystem(root)
    try:
        return Topology.from_dict(read_json(fs, _topology_path(base, run_id)))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise StoreError(f"cannot read the topology under {root}: {e}") from e
