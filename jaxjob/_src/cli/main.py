"""The ``jaxjob`` command line: ``ls``, ``show``, ``export``, ``verify`` and ``launch``.

Public as :mod:`jaxjob.cli`, whose docstring says more.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

__all__ = ["main"]

USER_ERRORS = (OSError, ValueError, KeyError, TypeError)


def _add_selection(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "path", help="a checkpoint directory, or a db_prefix (its latest committed epoch)"
    )
    command.add_argument("--epoch", type=int, default=None, help="with a db_prefix: this epoch")
    command.add_argument("--node", default=None, help="with a db_prefix: only this node")
    command.add_argument(
        "--leaves",
        action="append",
        default=None,
        metavar="PATTERN",
        help="a name or /-joined key path, * within a segment, ** across (repeatable)",
    )


def _ls(commands) -> None:
    command = commands.add_parser(
        "ls",
        help="list the checkpoints under a db_prefix (local, gs://, s3://)",
        description="One row per checkpoint: node, epoch, committed, size, save time, age.",
    )
    command.add_argument("directory")
    command.add_argument("--json", action="store_true", help="print JSON rows")


def _show(commands) -> None:
    command = commands.add_parser(
        "show",
        help="the leaves of a checkpoint: key path, shape, dtype, bytes, saved sharding",
        description="A table of a checkpoint's leaves (key path, shape, dtype, bytes, the "
        "sharding it was saved with) and totals.",
    )
    _add_selection(command)


def _export(commands) -> None:
    command = commands.add_parser(
        "export",
        help="write leaves to .npz or .safetensors, keyed by /-joined key path",
        description="Writes the selected leaves (default: all) to FILE.npz or FILE.safetensors "
        "(needs the safetensors package), one array per leaf keyed by its /-joined key path. "
        "PRNG keys are written as their key data; .npz stores bfloat16 and float8 as float32.",
    )
    _add_selection(command)
    command.add_argument("-o", "--output", required=True, metavar="FILE")


def _verify(commands) -> None:
    command = commands.add_parser(
        "verify",
        help="check that checkpoints are intact (exit 0) or name each damaged leaf (exit 1)",
        description="Checks one checkpoint directory, or every committed checkpoint under a "
        "db_prefix: the commit marker, the manifest, and every leaf read on its own.",
    )
    command.add_argument("path")


def _launch(commands) -> None:
    command = commands.add_parser(
        "launch",
        help="run N local processes of one jax.distributed job",
        description="jaxjob launch -n N [--devices-per-process M] -- python script.py ...",
    )
    command.add_argument(
        "-n",
        "--num-processes",
        type=int,
        required=True,
        metavar="N",
        help="how many processes to start on this machine; process i gets JAXJOB_PROCESS_ID=i "
        "and all join one jax.distributed job through a coordinator on 127.0.0.1",
    )
    command.add_argument(
        "--devices-per-process",
        type=int,
        default=None,
        metavar="M",
        help="fake M CPU devices in each process (XLA_FLAGS="
        "--xla_force_host_platform_device_count=M), e.g. to try a mesh on a laptop; default: "
        "the platform's own devices",
    )
    command.add_argument("program", nargs=argparse.REMAINDER, help="-- then the command to run")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jaxjob")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxjob", description="jaxjob command line")
    parser.add_argument("--version", action="version", version=f"jaxjob {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    for add in (_ls, _show, _export, _verify, _launch):
        add(commands)
    return parser


def _run_launch(args: argparse.Namespace) -> int:
    from jaxjob._src.multihost.launch import launch

    program = list(args.program)
    if program[:1] == ["--"]:
        program = program[1:]
    return launch(
        program, num_processes=args.num_processes, devices_per_process=args.devices_per_process
    )


def _command(args: argparse.Namespace) -> Callable[[], int]:
    from jaxjob._src.cli import commands

    if args.command == "ls":
        return lambda: commands.ls(args.directory, as_json=args.json)
    if args.command == "verify":
        return lambda: commands.verify(args.path)
    selection = {"patterns": args.leaves, "epoch": args.epoch, "node": args.node}
    if args.command == "show":
        return lambda: commands.show(args.path, **selection)
    return lambda: commands.export(args.path, args.output, **selection)


def _one_line(err: BaseException) -> str:
    text = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
    return " ".join(str(text).split())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``jaxjob`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    run = (lambda: _run_launch(args)) if args.command == "launch" else _command(args)
    try:
        return run()
    except USER_ERRORS as err:
        print(f"jaxjob {args.command}: {_one_line(err)}", file=sys.stderr)
        return 2
    except ImportError as err:
        from jaxjob._src.base.fs import MissingExtraError  # imported by the command that raised

        if not isinstance(err, MissingExtraError):
            raise
        print(f"jaxjob {args.command}: {_one_line(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
