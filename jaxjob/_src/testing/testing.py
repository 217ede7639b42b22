"""Fault injection: run a job in a child process, kill it, restart it, check that resume is exact.

Public as :mod:`jaxjob.testing`, whose docstring says more.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxjob._src.base import faults, fs
from jaxjob._src.base.faults import POINTS  # kill_at= names one: jaxjob.testing.POINTS
from jaxjob._src.checkpoint import layout, manifest
from jaxjob._src.checkpoint.restore import restore
from jaxjob._src.manager import lock

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
EXIT_WAIT_S = 60.0  # how long every process of an ended job may take to exit after SIGKILL
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


def _command(argv: Sequence[str], processes: int) -> list[str]:
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be an int >= 1, got {processes!r}")
    if isinstance(argv, str) or not argv:
        raise ValueError(f"argv must be a non-empty list of arguments after python, got {argv!r}")
    program = [sys.executable, *map(str, argv)]
    if processes == 1:
        return program
    return [sys.executable, "-m", "jaxjob.cli", "launch", "-n", str(processes), "--", *program]


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


def _start(command: list[str], env: Mapping[str, str] | None) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: one killpg reaches every process
    )


def _running_in_group(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` still running (a zombie has exited: not listed).

    Read from ``/proc`` on Linux; elsewhere any member, zombies included, counts.
    """
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    found = []
    for pid in (int(entry) for entry in os.listdir("/proc") if entry.isdigit()):
        fields = lock.stat_fields(pid)  # None: it exited while we looked
        running = fields and len(fields) > 2 and fields[0] not in lock.EXITED_STATES
        if running and int(fields[2]) == pgid:
            found.append(pid)
    return sorted(found)


def _end_group(pgid: int, output: list[str], timeout_s: float = EXIT_WAIT_S) -> None:
    """SIGKILLs what is left of process group ``pgid`` and waits until every process exited.

    The launcher of a multi-process job exits before the processes it
    started are gone (killed with it, or left behind); a restart meeting one
    of them would find the node's lock held or the coordinator's port taken.

    Raises:
        AssertionError: If some process still runs ``timeout_s`` after SIGKILL.
    """
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # every process of the group is gone and reaped
        return
    deadline = time.monotonic() + timeout_s
    while running := _running_in_group(pgid):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"processes {running} of the job (process group {pgid}) still run {timeout_s:g} s "
                f"after SIGKILL (stuck in the kernel, e.g. on I/O?). Output:\n"
                f"{''.join(output)[-4000:]}"
            )
        time.sleep(0.02)


def _read_lines(stream: Any, into: list[str]) -> None:
    for line in stream:
        into.append(line)


def _wait(proc: subprocess.Popen, timeout_s: float, delay_s: float | None) -> tuple[int, str]:
    """Waits for ``proc``, reading its output, and kills its process group after ``delay_s``.

    It returns only once every process of the group has exited (what is
    left when ``proc`` ends is killed), so a restart meets none of them. A
    process the job started and left running holds its output open: the
    output is read to its end only after that.

    Returns:
        Its exit status and output.

    Raises:
        AssertionError: If it runs past ``timeout_s`` (it is killed), or a
            process of its group does not exit within :data:`EXIT_WAIT_S` of
            SIGKILL, or its output stays open that long after (a process
            that left the group holds it).
    """
    lines: list[str] = []
    reader = threading.Thread(
        target=_read_lines, args=(proc.stdout, lines), name="jaxjob-testing output", daemon=True
    )
    reader.start()
    killing = delay_s is not None and delay_s < timeout_s
    try:
        proc.wait(timeout=delay_s if killing else timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        timed_out = not killing
    _end_group(proc.pid, lines)
    reader.join(EXIT_WAIT_S)
    output = "".join(lines)
    if reader.is_alive():
        raise AssertionError(
            f"the job's output stayed open {EXIT_WAIT_S:g} s after every process of its process "
            f"group {proc.pid} exited: a process it started left the group (setsid?) and still "
            f"runs. Output:\n{output[-4000:]}"
        )
    proc.stdout.close()
    if timed_out:
        raise AssertionError(f"the job did not end within {timeout_s} s. Output:\n{output[-4000:]}")
    return proc.returncode, output


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
    status, output = _wait(_start(_command(argv, processes), env), timeout_s, None)
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
        kill_at: A fail point of :data:`jaxjob._src.base.faults.POINTS`, ``"name"`` or
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
    status, output = _wait(_start(_command(argv, processes), extra), timeout_s, delay_s)
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


# ---- final workspaces -----------------------------------------------------------------------


def _records(tree: Any) -> dict[str, Any]:
    """The tree structure, each leaf's key path and kind, and its bytes per local shard."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    found: dict[str, Any] = {"treedef": str(treedef), "paths": [], "kinds": []}
    for i, (path, leaf) in enumerate(leaves):
        found["paths"].append(jax.tree_util.keystr(path))
        dtype = getattr(leaf, "dtype", type(leaf).__name__)
        found["kinds"].append(f"{type(leaf).__name__}:{dtype}:{getattr(leaf, 'sharding', None)}")
        shards = [leaf]
        if isinstance(leaf, jax.Array):
            if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                leaf = jax.random.key_data(leaf)
            shards = [s.data for s in sorted(leaf.addressable_shards, key=lambda s: s.device.id)]
        for j, shard in enumerate(shards):
            found[f"leaf{i}_shard{j}"] = np.ascontiguousarray(shard).reshape(-1).view(np.uint8)
    return found


def dump_workspace(workspace: Mapping[str, Any], directory: str) -> None:
    """Writes this process's part of ``workspace`` to ``directory/process<i>.npz``, bit for bit.

    Each process of a multi-process job writes the shards it holds, the
    tree structure and each leaf's key path, type, dtype and sharding.
    Call it at the end of a job script; compare with :func:`assert_bitwise_equal`.
    """
    found = _records(dict(workspace))
    found["paths"], found["kinds"] = np.array(found["paths"]), np.array(found["kinds"])
    os.makedirs(directory, exist_ok=True)
    np.savez(os.path.join(directory, f"process{jax.process_index()}.npz"), **found)


def _load_dumps(where: Any) -> dict[str, dict[str, Any]]:
    """Each process's records: from the dumps in a directory, or of an in-memory workspace."""
    if not isinstance(where, str | os.PathLike):
        return {"process0.npz": _records(dict(where))}
    files = sorted(f for f in os.listdir(where) if f.endswith(".npz"))
    if not files:
        raise FileNotFoundError(f"no workspace dumps (process<i>.npz) in {os.fspath(where)!r}")
    found = {}
    for file in files:
        with np.load(os.path.join(where, file)) as npz:
            found[file] = {k: npz[k] for k in npz.files}
        found[file]["treedef"] = str(found[file]["treedef"])
        found[file]["paths"] = found[file]["paths"].tolist()
        found[file]["kinds"] = found[file]["kinds"].tolist()
    return found


def assert_bitwise_equal(a: Any, b: Any) -> None:
    """Asserts that two final workspaces are bitwise equal.

    Each of ``a`` and ``b`` is a directory written by :func:`dump_workspace`
    (every process's file is compared) or an in-memory workspace. Equal
    means the same tree structure, key paths, leaf types, dtypes, shardings
    and bytes (NaNs included).

    Raises:
        AssertionError: Naming the first difference.
    """
    left, right = _load_dumps(a), _load_dumps(b)
    if sorted(left) != sorted(right):
        raise AssertionError(
            f"the dumps come from other processes: {sorted(left)} vs {sorted(right)}"
        )
    for file, x in left.items():
        y = right[file]
        if x["treedef"] != y["treedef"]:
            raise AssertionError(f"the tree structures differ: {x['treedef']} vs {y['treedef']}")
        if x["paths"] != y["paths"] or len(x["kinds"]) != len(y["kinds"]):
            raise AssertionError(f"the key paths differ: {x['paths']} vs {y['paths']}")
        if x["kinds"] != y["kinds"]:
            diff = [
                f"{path}: {p} vs {q}"
                for path, p, q in zip(x["paths"], x["kinds"], y["kinds"], strict=True)
                if p != q
            ]
            raise AssertionError(f"the leaves' types, dtypes or shardings differ: {diff[:3]}")
        for name in sorted(k for k in x if k.startswith("leaf")):
            if name not in y or not np.array_equal(x[name], y[name]):
                leaf, _, shard = name[len("leaf") :].partition("_shard")
                where = x["paths"][int(leaf)]
                raise AssertionError(
                    f"the workspaces differ at {where} (shard {shard}): {x[name][:16]} vs "
                    f"{y.get(name, np.array([]))[:16]} (first bytes) in {file}"
                )


def assert_checkpoints_equal(
    a: str | os.PathLike,
    b: str | os.PathLike,
    *,
    epochs: Sequence[int] | None = None,
    nodes: Sequence[str] = ("local",),
) -> list[int]:
    """Asserts that two runs' checkpoints of the same epochs are bitwise equal.

    Every epoch committed under both ``a`` and ``b`` (or those of ``epochs``)
    is restored, each saved process's host-local copy in turn, onto this
    process's first device and compared with :func:`assert_bitwise_equal`.
    A killed and restarted job must write the same checkpoints as an
    uninterrupted one: this checks every resumed stretch, not only the end.
    Call it on one process.

    Returns:
        The epochs compared.

    Raises:
        AssertionError: Naming the epoch, node and first difference.
    """
    a, b = fs.normalize(a, "a"), fs.normalize(b, "b")
    common = sorted(set(layout.common_epochs(a, nodes)) & set(layout.common_epochs(b, nodes)))
    wanted = common if epochs is None else [e for e in epochs if e in common]
    for epoch in wanted:
        for node in nodes:
            path = layout.db_name(epoch, node, a)
            for row in range(manifest.read(path).process_count):
                left = restore(path, host_map=lambda p, row=row: row)
                right = restore(layout.db_name(epoch, node, b), host_map=lambda p, row=row: row)
                try:
                    assert_bitwise_equal(left, right)
                except AssertionError as err:
                    raise AssertionError(
                        f"epoch {epoch} of node {node!r} (process {row}'s copy): {err}"
                    ) from None
    return wanted
