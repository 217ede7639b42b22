"""The ``jaxjob`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from jaxjob.launch import launch

__all__ = ["main"]


def _human(size: float) -> str:
    """A byte count for people: ``'1.5 MiB'``."""
    if size < 1024:
        return f"{size:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024:
            return f"{size:.1f} {unit}"
    return f"{size / 1024:.1f} TiB"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _age(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, width in (("d", 86400), ("h", 3600), ("min", 60)):
        if value >= width:
            return f"{value / width:.1f} {unit}"
    return f"{value:.0f} s"


def ls(directory: str, *, as_json: bool = False) -> int:
    """Prints one row per checkpoint under ``directory``; returns the exit status."""
    from jaxjob.listing import list_checkpoints

    rows = [row.to_json() for row in list_checkpoints(directory)]
    if as_json:
        print(json.dumps(rows, indent=1))
        return 0
    table = [("node", "epoch", "committed", "size", "save", "age")]
    for r in rows:
        table.append(
            (
                r["node"],
                str(r["epoch"]),
                "yes" if r["committed"] else "no",
                _human(r["size_bytes"]),
                _seconds(r["save_s"]),
                _age(r["age_s"]),
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


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
    listing = commands.add_parser(
        "ls",
        help="list the checkpoints under a db_prefix (local, gs://, s3://)",
        description="jaxjob ls DIR [--json]: node, epoch, committed, size, save time, age",
    )
    listing.add_argument("directory")
    listing.add_argument("--json", action="store_true", help="print JSON rows")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``jaxjob`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "ls":
        try:
            return ls(args.directory, as_json=args.json)
        except (OSError, ValueError, TypeError) as err:
            print(f"jaxjob ls: {err}", file=sys.stderr)
            return 2
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
