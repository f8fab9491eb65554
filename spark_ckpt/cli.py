"""``spark-ckpt``: the command line.

* ``spark-ckpt demo …`` — the main job (see :mod:`spark_ckpt.demo`);
* ``spark-ckpt checkpoints --root R`` — completed checkpoints and savepoints of a pipeline;
* ``spark-ckpt savepoint --root R [--target DIR]`` / ``checkpoint`` / ``stop`` — ask the
  running pipeline's coordinator (through its mailbox) and wait for the answer.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from spark_ckpt.errors import SparkCkptError


def _store(root: str):  # type: ignore[no-untyped-def]
    from spark_ckpt.delta.store import DeltaCheckpointStore

    return DeltaCheckpointStore(root)


def cmd_checkpoints(args: argparse.Namespace) -> int:
    for cp in _store(args.root).list_completed():
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
    """Post a checkpoint/savepoint/stop request and wait for its answer. ``stop`` waits until
    the running pipeline has stopped (its final checkpoint completed, its output committed,
    its query ended). The request expires with ``--timeout``: a pipeline started later never
    acts on it."""
    import uuid

    from spark_ckpt.protocol.clock import SystemClock
    from spark_ckpt.spark.host import REQUEST_ID
    from spark_ckpt.spark.mailbox import Mailbox, Request, RequestKind
    from spark_ckpt.spark.run import Runs, RunState

    kind = RequestKind(args.command)
    request_id = uuid.uuid4().hex
    mailbox = Mailbox(args.root)
    name = mailbox.post(
        Request(
            request_id,
            kind,
            getattr(args, "target", None),
            args.command == "stop" and args.savepoint,
            SystemClock().now_ms() + int(args.timeout * 1000),
        )
    )
    deadline = time.monotonic() + args.timeout
    store = _store(args.root)
    answer = None
    while time.monotonic() < deadline:
        if answer is None:
            answer = next(
                (c for c in store.list_completed() if c.properties.get(REQUEST_ID) == request_id),
                None,
            )
        if answer is not None and kind is not RequestKind.STOP:
            break
        if answer is not None and any(
            s.stop_request == request_id and s.state is RunState.STOPPED
            for s in Runs(args.root).statuses()
        ):
            break
        time.sleep(0.2)
    else:
        mailbox.delete([name])  # not acted on yet: take it back
        what = "no answer" if answer is None else "the pipeline did not stop"
        print(
            f"error: {what} to the {kind.value} request within {args.timeout} s "
            f"(is the pipeline under {args.root} running?)",
            file=sys.stderr,
        )
        return 1
    assert answer is not None
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
