"""Fault injection: run a job in a child process, kill it, restart it, check that resume is exact.

Public as :mod:`jaxjob.testing`, whose docstring says more.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Mapping, Sequence
from typing import Any

from jaxjob._src.base import faults, fs
from jaxjob._src.base.faults import POINTS  # kill_at= names one: jaxjob.testing.POINTS
from jaxjob._src.checkpoint import layout
from jaxjob._src.testing import processes as child
from jaxjob._src.testing.compare import assert_bitwise_equal as assert_bitwise_equal
from jaxjob._src.testing.compare import assert_checkpoints_equal as assert_checkpoints_equal
from jaxjob._src.testing.compare import dump_workspace as dump_workspace

__all__ = [
    "POINTS",
    "Kill",
    "assert_bitwise_equal",
    "assert_checkpoints_equal",
    "dump_workspace",
    "kill_and_resume",
    "run",
    "run_killed",
]

DEFAULT_TIMEOUT_S = 600.0
_KILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)  # a plain child; the launcher's status


@dataclasses.dataclass(frozen=True)
class Kill:
    """What one killed run of a job did.

    Attributes:
        kill_at: The fail point it was killed at (``"name"`` or ``"name:n"``), or None.
        delay_s: The delay after which it was killed from outside, or None.
        killed: Whether SIGKILL ended it (False: it finished before the delay).
        resumed_from: The newest epoch committed when it started, which it
            resumed from (checked), or None if it started from scratch.
        committed: The epochs committed for every node once it was dead.
        output: Its stdout and stderr.
    """

    kill_at: str | None
    delay_s: float | None
    killed: bool
    resumed_from: int | None
    committed: list[int]
    output: str


# Its public path, in reprs, help() and pickles; set once the dataclass exists (its decorator
# reads the module its __module__ names, which need not be imported yet).
Kill.__module__ = "jaxjob.testing"


def _check_kill_at(kill_at: str) -> str:
    name, _, count = kill_at.partition(":")
    if name not in faults.POINTS or not (count == "" or count.isdigit() and int(count) >= 1):
        raise ValueError(
            f"kill_at must be a fail point of {faults.POINTS}, optionally with ':n' (the n-th "
            f"time it is reached, n >= 1), got {kill_at!r}"
        )
    return kill_at


def _marks(db_prefix: str, nodes: Sequence[str], epoch: int) -> list[tuple[int, int]]:
    """The identity of each node's checkpoint of ``epoch``: changes if it is rewritten."""
    marks = []
    for node in nodes:
        path = layout.db_name(epoch, node, db_prefix)
        commit = os.path.join(path, layout.COMMIT_MARKER)
        marks.append((os.stat(path).st_ino, os.stat(commit).st_mtime_ns))
    return marks


def _newest(db_prefix: str, nodes: Sequence[str]) -> tuple[int | None, list[tuple[int, int]]]:
    """The newest epoch committed for every node, and the identity of its checkpoints."""
    epochs = layout.common_epochs(db_prefix, nodes)
    return (epochs[-1], _marks(db_prefix, nodes, epochs[-1])) if epochs else (None, [])


def _check_resumed(db_prefix: str, nodes: Sequence[str], before: Any, output: str) -> None:
    """Asserts that the newest checkpoint before the run came through it untouched.

    Retention may have deleted it once newer epochs were committed.
    """
    epoch, marks = before
    if epoch is None:
        return
    now = layout.common_epochs(db_prefix, nodes)
    if (epoch in now and _marks(db_prefix, nodes, epoch) == marks) or (
        epoch not in now and now and now[-1] > epoch
    ):
        return
    raise AssertionError(
        f"the run did not resume from epoch {epoch}, the newest committed one: its "
        f"checkpoint under {db_prefix!r} was rewritten or lost. Output:\n{output[-4000:]}"
    )


def run(
    argv: Sequence[str],
    *,
    processes: int = 1,
    env: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    db_prefix: str | os.PathLike | None = None,
    nodes: Sequence[str] = ("local",),
) -> str:
    """Runs ``python ARGV...`` (on ``processes`` processes) to completion; returns its output.

    Args:
        argv: The script and its arguments.
        processes: How many processes (``jaxjob launch -n``) run it.
        env: Extra environment variables.
        timeout_s: How long it may take.
        db_prefix: Its checkpoints; if given, the run is checked to resume
            from the newest epoch committed there for every node of ``nodes``.
        nodes: The job's checkpointed nodes.

    Raises:
        AssertionError: If it fails, times out or does not resume as it should.
    """
    db_prefix = None if db_prefix is None else fs.normalize(db_prefix, "db_prefix")
    before = _newest(db_prefix, nodes) if db_prefix is not None else (None, [])
    status, output = child.wait(child.start(child.command(argv, processes), env), timeout_s, None)
    if status != 0:
        raise AssertionError(f"the job exited with status {status}. Output:\n{output[-4000:]}")
    if db_prefix is not None:
        _check_resumed(db_prefix, nodes, before, output)
    return output


def run_killed(
    argv: Sequence[str],
    db_prefix: str | os.PathLike,
    *,
    kill_at: str | None = None,
    delay_s: float | None = None,
    processes: int = 1,
    nodes: Sequence[str] = ("local",),
    env: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Kill:
    """Runs the job and kills it with SIGKILL, at a fail point or after a delay.

    It may itself be a restart: call it again to kill the job several times
    before :func:`run` completes it.

    Args:
        argv: The script and its arguments (run as ``python ARGV...``).
        db_prefix: Where the job keeps its checkpoints (local disk).
        kill_at: A fail point of :data:`jaxjob.testing.POINTS`, ``"name"`` or
            ``"name:n"`` (the n-th time it is reached in this run); every
            process of the job dies there.
        delay_s: Kill every process of the job this many seconds after it starts.
        processes: How many processes (``jaxjob launch -n``) run it.
        nodes: The job's checkpointed nodes.
        env: Extra environment variables.
        timeout_s: How long the run may take.

    Returns:
        What the run did (:class:`Kill`).

    Raises:
        ValueError: If not exactly one of ``kill_at`` and ``delay_s`` is given.
        AssertionError: If the job failed another way, finished without
            reaching ``kill_at``, or did not resume from the newest committed epoch.
    """
    if (kill_at is None) == (delay_s is None):
        raise ValueError(
            f"give one of kill_at and delay_s, got kill_at={kill_at!r}, delay_s={delay_s!r}"
        )
    if delay_s is not None and (isinstance(delay_s, bool) or not delay_s >= 0):
        raise ValueError(f"delay_s must be a number of seconds >= 0, got {delay_s!r}")
    db_prefix = fs.normalize(db_prefix, "db_prefix")
    extra = {**(env or {}), faults.KILL_AT_ENV: _check_kill_at(kill_at)} if kill_at else env
    before = _newest(db_prefix, nodes)
    status, output = child.wait(
        child.start(child.command(argv, processes), extra), timeout_s, delay_s
    )
    killed = status in _KILLED
    if not killed and (status != 0 or kill_at is not None):
        why = f"finished without reaching {kill_at!r}" if status == 0 else f"exited with {status}"
        raise AssertionError(f"the job {why}. Output:\n{output[-4000:]}")
    _check_resumed(db_prefix, nodes, before, output)
    committed = layout.common_epochs(db_prefix, nodes)
    return Kill(kill_at, delay_s, killed, before[0], committed, output)


def kill_and_resume(
    argv: Sequence[str],
    db_prefix: str | os.PathLike,
    *,
    kill_at: str | None = None,
    delay_s: float | None = None,
    processes: int = 1,
    nodes: Sequence[str] = ("local",),
    env: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Kill:
    """Kills the job once (:func:`run_killed`), then restarts it to completion (:func:`run`).

    The restart is checked to resume from the newest epoch committed when
    the job died. Compare the restarted job's final workspace with an
    uninterrupted run's with :func:`assert_bitwise_equal`. Arguments as in
    :func:`run_killed`.

    Returns:
        What the killed run did; its ``committed[-1]`` is the epoch the restart resumed from.
    """
    kill = run_killed(
        argv,
        db_prefix,
        kill_at=kill_at,
        delay_s=delay_s,
        processes=processes,
        nodes=nodes,
        env=env,
        timeout_s=timeout_s,
    )
    run(argv, processes=processes, env=env, timeout_s=timeout_s, db_prefix=db_prefix, nodes=nodes)
    return kill
