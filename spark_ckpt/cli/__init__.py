"""``spark-ckpt``: the command line.

::

    spark-ckpt demo …                                  the main job (spark_ckpt.demo), with
                                                       --restore-savepoint/-checkpoint/-as-of
    spark-ckpt checkpoints list  --root R              retained checkpoints and savepoints
    spark-ckpt checkpoints show ID --root R            one checkpoint: subtasks, state, positions
    spark-ckpt checkpoint --root R                     trigger a checkpoint and wait for it
    spark-ckpt savepoint trigger --root R [--target D] trigger a savepoint; prints its path
    spark-ckpt savepoint stop --root R [--drain]       stop the pipeline with a savepoint
    spark-ckpt savepoint list --dir D | --root R       savepoints in a directory
    spark-ckpt savepoint dispose PATH                  delete a savepoint
    spark-ckpt stop --root R [--savepoint] [--drain]   stop with a final checkpoint
    spark-ckpt state read --path P [--uid U --state S] state of a checkpoint/savepoint
    spark-ckpt stats --root R [--plot FILE.png]        the checkpoint statistics history
    spark-ckpt ui --root R [--port P]                  the checkpoint page, its API, /metrics

Tables by default, ``--json`` (JSON lines) for scripts. Every failure ends in one ``error: …`` line
on stderr and a non-zero exit: bad input (a missing root, an unknown id, a bad time or file type, a
damaged store) exits with 2; a request with no live run of the pipeline to answer it, or one it did
not answer in time, exits with 1; a failed ``demo`` with 1; an unexpected error with 1, its line
naming the exception's type (``SPARK_CKPT_DEBUG=1`` prints its traceback too); Ctrl-C with 130 and
no traceback. Requests and queries go through
:class:`~spark_ckpt.client.pipeline_client.PipelineClient`, the client of the pipeline object and
the notebooks.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from spark_ckpt.cli import commands
from spark_ckpt.errors import SparkCkptError, StoreError
from spark_ckpt.locations.uris import normalized

Command = Callable[[argparse.Namespace], int]

#: Environment variable: set to ``1`` to print the traceback of an unexpected error.
DEBUG_ENV = "SPARK_CKPT_DEBUG"


def fail(message: str, status: int) -> int:
    """Print *message* as the one ``error: …`` line of a failed command (its whitespace,
    newlines included, folded); returns *status*."""
    text = " ".join(message.split()) or "failed"
    print(f"error: {text}", file=sys.stderr, flush=True)
    return status


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with a usage error ending in one ``error: …`` line (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"error: {message}\n")


def _command(
    sub: argparse._SubParsersAction[ArgumentParser],
    name: str,
    text: str,
    func: Command,
    *,
    root: bool = True,
    timeout: bool = False,
) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=text, description=text)
    if root:
        p.add_argument("--root", required=True, help="the pipeline root")
    if timeout:
        p.add_argument(
            "--timeout", type=float, default=120.0, help="seconds to wait for the answer"
        )
    p.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    p.set_defaults(func=func)
    return p


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="spark-ckpt",
        description="Flink-style checkpoints and savepoints for Spark Structured Streaming.",
        epilog=f"Failures end in one 'error: ...' line; {DEBUG_ENV}=1 adds the traceback of "
        "an unexpected error.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("demo", help="run the main job (see `spark-ckpt demo --help`)")

    cps = sub.add_parser(
        "checkpoints", help="list or show completed checkpoints, pause or resume periodic ones"
    )
    cps_sub = cps.add_subparsers(dest="action", required=True, metavar="ACTION")
    _command(
        cps_sub, "list", "retained completed checkpoints and savepoints", commands.checkpoints_list
    )
    show = _command(
        cps_sub, "show", "one completed checkpoint in detail", commands.checkpoints_show
    )
    show.add_argument("id", type=int, help="checkpoint id")
    _command(
        cps_sub,
        "pause",
        "pause the periodic checkpoints of the running pipeline (and of its next runs) until "
        "resumed; manual checkpoints, savepoints and stop still work",
        commands.checkpoints_pause,
        timeout=True,
    )
    _command(
        cps_sub,
        "resume",
        "resume the periodic checkpoints of the running pipeline",
        commands.checkpoints_resume,
        timeout=True,
    )

    _command(
        sub,
        "checkpoint",
        "trigger a checkpoint and wait for it",
        commands.checkpoint_trigger,
        timeout=True,
    )

    sps = sub.add_parser("savepoint", help="trigger, stop with, list or dispose savepoints")
    sps_sub = sps.add_subparsers(dest="action", required=True, metavar="ACTION")
    trig = _command(
        sps_sub,
        "trigger",
        "trigger a savepoint of the running pipeline; prints where it was written",
        commands.savepoint_trigger,
        timeout=True,
    )
    trig.add_argument("--target", default=None, help="savepoint directory (default savepoint.dir)")
    sp_stop = _command(
        sps_sub,
        "stop",
        "stop the running pipeline with a final savepoint",
        commands.stop,
        timeout=True,
    )
    sp_stop.add_argument("--drain", action="store_true", help="read all available input first")
    sp_stop.set_defaults(savepoint=True)
    lst = _command(
        sps_sub, "list", "the savepoints in a directory", commands.savepoint_list, root=False
    )
    lst.add_argument("--dir", default=None, help="a savepoint directory")
    lst.add_argument("--root", default=None, help="a pipeline root (lists ROOT/savepoints)")
    disp = _command(
        sps_sub, "dispose", "delete a savepoint directory", commands.savepoint_dispose, root=False
    )
    disp.add_argument("path", help="the savepoint's directory")

    st = _command(
        sub,
        "stop",
        "stop the running pipeline with a final checkpoint (or --savepoint)",
        commands.stop,
        timeout=True,
    )
    st.add_argument("--savepoint", action="store_true", help="a savepoint instead of a checkpoint")
    st.add_argument("--drain", action="store_true", help="read all available input first")

    state = sub.add_parser("state", help="read the state of a checkpoint or savepoint")
    state_sub = state.add_subparsers(dest="action", required=True, metavar="ACTION")
    rd = _command(
        state_sub,
        "read",
        "list the states of a checkpoint or savepoint, or read one (a table, Parquet or CSV)",
        commands.state_read,
        root=False,
    )
    rd.add_argument("--path", required=True, help="a pipeline root or a savepoint directory")
    rd.add_argument("--checkpoint", type=int, default=None, help="checkpoint id (default latest)")
    rd.add_argument("--uid", default=None, help="operator uid")
    rd.add_argument("--state", default=None, help="state name")
    rd.add_argument("--out", default=None, help="write all rows to FILE.parquet or FILE.csv")
    rd.add_argument("--limit", type=int, default=20, help="rows to print (0: all)")

    sts = _command(
        sub,
        "stats",
        "the checkpoint statistics history (newest checkpoint.history checkpoints, completed,"
        " failed, aborted): duration, size, alignment, failure reasons",
        commands.stats,
    )
    sts.add_argument("--plot", default=None, metavar="FILE.png", help="also draw them over time")

    ui = sub.add_parser(
        "ui",
        help="serve the checkpoint page, its JSON API and /metrics for a pipeline root",
        description="Serve the checkpoint page of the pipeline under --root (running or "
        "stopped), its JSON API (/checkpoints, /checkpoints/config, /checkpoints/details/ID) "
        "and Prometheus metrics (/metrics) until Ctrl-C.",
    )
    ui.add_argument("--root", required=True, help="the pipeline root")
    ui.add_argument("--port", type=_port, default=8082, help="port (default 8082; 0: any free one)")
    ui.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: this machine only)"
    )
    ui.add_argument("--pipeline", default=None, help="name on the page and in metric labels")
    ui.set_defaults(func=commands.ui)
    return p


def _port(text: str) -> int:
    """A TCP port number, 0 to 65535 (argparse's type: a usage error otherwise)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0 to 65535)")
    return port


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status. Never raises (but ``SystemExit`` from
    ``--help``): see the module docstring for how failures end."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args: argparse.Namespace | None = None
    try:
        if argv[:1] == ["demo"]:
            from spark_ckpt.demo import main as demo

            return demo(argv[1:])
        args = parser().parse_args(argv)
        return int(args.func(args))
    except StoreError as e:  # a store that cannot be read: say which
        _debug_trace()
        where = (
            getattr(args, "root", None) or getattr(args, "path", None) or getattr(args, "dir", None)
        )
        return fail(_located(str(e), where), 2)
    except SparkCkptError as e:
        _debug_trace()
        return fail(str(e), 2)
    except KeyboardInterrupt:
        if getattr(args, "command", None) == "ui":
            return 0  # Ctrl-C is how the page's server is stopped
        return fail("interrupted", 130)
    except Exception as e:  # a bug or an error not translated at a boundary: no trace either
        _debug_trace()
        return fail(f"{type(e).__name__}: {e}", 1)


def _located(message: str, where: str | None) -> str:
    """*message* naming the store *where* the command read, if it does not already."""
    if not where:
        return message
    path = normalized(where)
    return message if path in message else f"checkpoint store {path}: {message}"


def _debug_trace() -> None:
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        traceback.print_exc(file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
