"""``spark-ckpt``: the command line.

* ``spark-ckpt demo …`` — the main job (see :mod:`spark_ckpt.demo`);
* ``spark-ckpt checkpoints --root R`` — completed checkpoints and savepoints of a pipeline;
* ``spark-ckpt savepoint --root R [--target DIR]`` / ``checkpoint`` / ``stop`` — ask the
  running pipeline's coordinator and wait for the answer.

Every command goes through :class:`~spark_ckpt.spark.client.PipelineClient`, the client that
the pipeline object and notebooks use too.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from spark_ckpt.errors import CheckpointError, SparkCkptError

if TYPE_CHECKING:
    from spark_ckpt.spark.client import PipelineClient


def _client(root: str) -> PipelineClient:
    from spark_ckpt.spark.client import PipelineClient

    return PipelineClient(root)


def cmd_checkpoints(args: argparse.Namespace) -> int:
    for cp in _client(args.root).checkpoints():
        s = cp.stats
        print(
            json.dumps(
                {
                    "id": cp.checkpoint_id,
                    "type": cp.snapshot_type.value,
                    "duration_ms": s.end_to_end_ms,
                    "state_bytes": s.state_bytes,
                    "bytes_written": s.bytes_written,
                    "alignment_ms": s.max_alignment_ms,
                    "offsets": {f"{k[0]}/{k[1]}": v for k, v in sorted(cp.offsets().items())},
                    "properties": dict(cp.properties),
                }
            )
        )
    return 0


def cmd_request(args: argparse.Namespace) -> int:
    """Post a checkpoint/savepoint/stop request through the pipeline's client and wait for
    its answer. ``stop`` waits until the running pipeline has stopped (its final checkpoint
    completed, its output committed, its query ended). The request expires with
    ``--timeout``: a pipeline started later never acts on it."""
    client = _client(args.root)
    try:
        if args.command == "stop":
            answer = client.stop(savepoint=args.savepoint, timeout_s=args.timeout)
        elif args.command == "savepoint":
            answer = client.savepoint(args.target, timeout_s=args.timeout)
        else:
            answer = client.checkpoint(timeout_s=args.timeout)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(
        json.dumps(
            {"id": answer.checkpoint_id, "type": answer.snapshot_type.value, **answer.properties}
        )
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:
        from spark_ckpt.demo import main as demo

        return demo(argv[1:])
    p = argparse.ArgumentParser(prog="spark-ckpt", description="Flink-style checkpoints for Spark")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run the main job (see `spark-ckpt demo --help`)")
    c = sub.add_parser("checkpoints", help="list completed checkpoints and savepoints")
    c.add_argument("--root", required=True)
    c.set_defaults(func=cmd_checkpoints)
    for name, text in (
        ("checkpoint", "trigger a checkpoint"),
        ("savepoint", "trigger a savepoint"),
        ("stop", "stop the running pipeline with a final checkpoint (or --savepoint)"),
    ):
        r = sub.add_parser(name, help=text)
        r.add_argument("--root", required=True)
        r.add_argument("--timeout", type=float, default=120.0)
        if name == "savepoint":
            r.add_argument("--target", default=None)
        if name == "stop":
            r.add_argument("--savepoint", action="store_true")
        r.set_defaults(func=cmd_request)
    args = p.parse_args(argv)
    try:
        return int(args.func(args))
    except SparkCkptError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
