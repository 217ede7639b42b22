"""Fail points: named moments where the fault-injection kit can kill the process.

Code that writes checkpoints calls :func:`point` at the moments that matter
for crash safety. Nothing happens unless the environment variable
``JAXJOB_KILL_AT`` names that point (``"<name>"`` or ``"<name>:<n>"``, the
``n``-th time it is reached, counting from 1; several, comma-separated, name
several moments); then the process kills itself
with SIGKILL, exactly as a lost node would die. :mod:`jaxjob.testing` sets it
in the child processes it starts. ``JAXJOB_FAIL_AT`` (same form) makes that
point raise ``OSError(EIO)`` instead, as a failing disk would.

Example:
    >>> point("retention.delete")  # JAXJOB_KILL_AT is not set: returns at once
"""

from __future__ import annotations

import collections
import errno
import os
import signal

__all__ = ["FAIL_AT_ENV", "KILL_AT_ENV", "POINTS", "point", "reset"]

KILL_AT_ENV = "JAXJOB_KILL_AT"
FAIL_AT_ENV = "JAXJOB_FAIL_AT"
POINTS = (
    "epoch",  # inside an epoch, before its workspace is saved
    "save.copy",  # the device-to-host copy of a save has started
    "save.write",  # the background write has started
    "save.commit",  # the write is done, the commit has not happened
    "save.after_rename",  # local disk: renamed to its final name, the parent not yet flushed
    "local.save.copy",  # the same three of a save to the local tier (jaxjob.LocalTier)
    "local.save.write",
    "local.save.commit",
    "history.saved",  # a save has returned, its epoch's final history record is not yet written
    "retention.delete",  # retention is deleting an old epoch
    "lock.takeover",  # a dead writer's lock is being taken over
)
_reached: collections.Counter[tuple[str, str]] = collections.Counter()


def _now(env: str, name: str) -> bool:
    wanted = os.environ.get(env)
    if not wanted:
        return False
    counts = [c for t, _, c in (w.partition(":") for w in wanted.split(",")) if t == name]
    if not counts:
        return False
    _reached[env, name] += 1
    return _reached[env, name] in {int(c or 1) for c in counts}


def point(name: str) -> None:
    """Kills this process (``JAXJOB_KILL_AT``) or raises EIO (``JAXJOB_FAIL_AT``) if named now.

    Raises:
        OSError: ``EIO``, if ``JAXJOB_FAIL_AT`` names this point now.
    """
    if _now(KILL_AT_ENV, name):
        os.kill(os.getpid(), signal.SIGKILL)
    if _now(FAIL_AT_ENV, name):
        raise OSError(errno.EIO, f"injected I/O error at the fail point {name!r}")


def reset() -> None:
    """Counts every point from zero again: for a process that sets the variables anew.

    The ``n`` of ``"<name>:<n>"`` counts the passes since the process started
    (or since this call): a test that sets ``JAXJOB_FAIL_AT`` in its own process
    after another test passed that point calls this first.
    """
    _reached.clear()
