"""The ``jaxjob`` command line: ``ls``, ``show``, ``export``, ``verify``, ``bench`` and ``launch``.

Public as :mod:`jaxjob.cli`, whose docstring says more. Every subcommand is a row
of :data:`SUBCOMMANDS` (its help texts, its arguments, the function running it):
a new subcommand is one row and its function in :mod:`jaxjob._src.cli.commands`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["SUBCOMMANDS", "Argument", "Subcommand", "main"]

USER_ERRORS = (OSError, ValueError, KeyError, TypeError)


@dataclasses.dataclass(frozen=True)
class Argument:
    """One argument of a subcommand: ``add_argument(*flags, **options)``."""

    flags: tuple[str, ...]
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def _arg(*flags: str, **options: Any) -> Argument:
    return Argument(flags, options)


@dataclasses.dataclass(frozen=True)
class Subcommand:
    """A row of :data:`SUBCOMMANDS`: its name, help texts, arguments and what runs it.

    ``run`` imports what the subcommand needs when it is called, so that
    parsing and ``--help`` import neither JAX nor Orbax.
    """

    name: str
    help: str
    description: str
    arguments: tuple[Argument, ...]
    run: Callable[[argparse.Namespace], int]


SELECTION = (
    _arg("path", help="a checkpoint directory, or a db_prefix (its latest committed epoch)"),
    _arg("--epoch", type=int, default=None, help="with a db_prefix: this epoch"),
    _arg("--node", default=None, help="with a db_prefix: only this node"),
    _arg(
        "--leaves",
        action="append",
        default=None,
        metavar="PATTERN",
        help="a name or /-joined key path, * within a segment, ** across (repeatable)",
    ),
)


def _selection(args: argparse.Namespace) -> dict[str, Any]:
    return {"patterns": args.leaves, "epoch": args.epoch, "node": args.node}


def _run_ls(args: argparse.Namespace) -> int:
    from jaxjob._src.cli import commands

    return commands.ls(args.directory, as_json=args.json)


def _run_show(args: argparse.Namespace) -> int:
    from jaxjob._src.cli import commands

    return commands.show(args.path, **_selection(args))


def _run_export(args: argparse.Namespace) -> int:
    from jaxjob._src.cli import commands

    return commands.export(
        args.path, args.output, strip_value=args.strip_nnx_value, **_selection(args)
    )


def _run_verify(args: argparse.Namespace) -> int:
    from jaxjob._src.cli import commands

    return commands.verify(args.path)


def _run_bench(args: argparse.Namespace) -> int:
    from jaxjob._src.cli import commands

    return commands.bench(
        args.directory,
        leaves=args.leaves,
        size=args.bytes,
        like=args.like,
        repeats=args.repeats,
        step_seconds=args.step_seconds,
        as_json=args.json,
    )


def _run_launch(args: argparse.Namespace) -> int:
    from jaxjob._src.multihost.launch import launch

    program = list(args.program)
    if program[:1] == ["--"]:
        program = program[1:]
    return launch(
        program, num_processes=args.num_processes, devices_per_process=args.devices_per_process
    )


SUBCOMMANDS = (
    Subcommand(
        "ls",
        help="list the checkpoints under a db_prefix (local, gs://, s3://)",
        description="One row per checkpoint: node, epoch, committed, size, save time, age.",
        arguments=(_arg("directory"), _arg("--json", action="store_true", help="print JSON rows")),
        run=_run_ls,
    ),
    Subcommand(
        "show",
        help="the leaves of a checkpoint: key path, shape, dtype, bytes, saved sharding",
        description="A table of a checkpoint's leaves (key path, shape, dtype, bytes, the "
        "sharding it was saved with) and totals.",
        arguments=SELECTION,
        run=_run_show,
    ),
    Subcommand(
        "export",
        help="write leaves to .npz or .safetensors, keyed by /-joined key path",
        description="Writes the selected leaves (default: all) to FILE.npz or FILE.safetensors "
        "(needs the safetensors package), one array per leaf keyed by its /-joined key path. "
        "Nothing is lost: PRNG keys are written as their key data, dtypes the format lacks "
        "(.npz: bfloat16, float8, int4; .safetensors: all but bfloat16) as their bits; the "
        "keys' implementations and those dtypes are recorded as JSON in the .npz entry "
        "__jaxjob__ or the .safetensors metadata key jaxjob.",
        arguments=(
            *SELECTION,
            _arg("-o", "--output", required=True, metavar="FILE"),
            _arg(
                "--strip-nnx-value",
                action="store_true",
                help="drop the trailing /value of flax NNX Variables' key paths "
                "(params/kernel/value becomes params/kernel)",
            ),
        ),
        run=_run_export,
    ),
    Subcommand(
        "verify",
        help="check that checkpoints are intact (exit 0) or name each damaged leaf (exit 1)",
        description="Checks one checkpoint directory, or every committed checkpoint under a "
        "db_prefix: the commit marker, the manifest, and every leaf read on its own.",
        arguments=(_arg("path"),),
        run=_run_verify,
    ),
    Subcommand(
        "bench",
        help="measure save, restore and the step slowdown on this disk, beside a minimal writer",
        description="Saves and restores a workspace with jaxjob.CheckpointManager under a "
        "scratch subdirectory of DIR (removed at the end), and times a jitted step alone and "
        "with a save every step; beside each figure, the same measured in the same run for a "
        "minimal writer (the bytes in one file, fsync, rename). Prints medians and ratios.",
        arguments=(
            _arg("directory", metavar="DIR", help="an existing writable directory, gs:// or s3://"),
            _arg(
                "--leaves",
                type=int,
                default=None,
                metavar="N",
                help="a synthetic workspace of N float32 leaves (default 56)",
            ),
            _arg(
                "--bytes",
                default=None,
                metavar="SIZE",
                help="its total size, split evenly: 64MiB (the default), 512KiB, 1GiB, ...",
            ),
            _arg(
                "--like",
                default=None,
                metavar="PATH",
                help="instead: the leaves' shapes and dtypes of this checkpoint (or db_prefix: "
                "its latest epoch), filled with random data",
            ),
            _arg("--repeats", type=int, default=3, help="measures of each figure (default 3)"),
            _arg(
                "--step-seconds",
                type=float,
                default=0.2,
                metavar="S",
                help="the step lasts S seconds alone (default 0.2), or 1.5 times the slower "
                "commit if longer, so that each save's write fits in the step it overlaps",
            ),
            _arg("--json", action="store_true", help="print JSON"),
        ),
        run=_run_bench,
    ),
    Subcommand(
        "launch",
        help="run N local processes of one jax.distributed job",
        description="jaxjob launch -n N [--devices-per-process M] -- python script.py ...",
        arguments=(
            _arg(
                "-n",
                "--num-processes",
                type=int,
                required=True,
                metavar="N",
                help="how many processes to start on this machine; process i gets "
                "JAXJOB_PROCESS_ID=i and all join one jax.distributed job through a coordinator "
                "on 127.0.0.1",
            ),
            _arg(
                "--devices-per-process",
                type=int,
                default=None,
                metavar="M",
                help="fake M CPU devices in each process (XLA_FLAGS="
                "--xla_force_host_platform_device_count=M), e.g. to try a mesh on a laptop; "
                "default: the platform's own devices",
            ),
            _arg("program", nargs=argparse.REMAINDER, help="-- then the command to run"),
        ),
        run=_run_launch,
    ),
)


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
    for row in SUBCOMMANDS:
        command = commands.add_parser(row.name, help=row.help, description=row.description)
        for argument in row.arguments:
            command.add_argument(*argument.flags, **argument.options)
    return parser


def _one_line(err: BaseException) -> str:
    text = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
    return " ".join(str(text).split())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``jaxjob`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    run = next(row.run for row in SUBCOMMANDS if row.name == args.command)
    try:
        status = run(args)
        sys.stdout.flush()  # a closed pipe raises here, not at the interpreter's exit
        return status
    except BrokenPipeError:  # `jaxjob ls | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush too
        return 128 + signal.SIGPIPE  # as a shell tool killed by SIGPIPE
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
