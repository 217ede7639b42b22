"""The ``jaxjob`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from jaxjob.launch import launch

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxjob", description="jaxjob command line")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "launch",
        help="run N local processes of one jax.distributed job",
        description="jaxjob launch -n N [--devices-per-process M] -- python script.py ...",
    )
    run.add_argument("-n", "--num-processes", type=int, required=True)
    run.add_argument("--devices-per-process", type=int, default=None)
    run.add_argument("program", nargs=argparse.REMAINDER, help="-- then the command to run")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``jaxjob`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    program = list(args.program)
    if program[:1] == ["--"]:
        program = program[1:]
    try:
        return launch(
            program,
            num_processes=args.num_processes,
            devices_per_process=args.devices_per_process,
        )
    except ValueError as err:
        print(f"jaxjob launch: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
