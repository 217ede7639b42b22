"""Fail points: named moments where the fault-injection kit can kill the process.

Code that writes checkpoints calls :func:`point` at the moments that matter
for crash safety. Nothing happens unless the environment variable
``JAXJOB_KILL_AT`` names that point (``"<name>"`` or ``"<name>:<n>"``, the
``n``-th time it is reached, counting from 1); then the process kills itself
with SIGKILL, exactly as a lost node would die. :mod:`jaxjob.testing` sets it
in the child processes it starts.

Example:
    >>> point("retention.delete")  # JAXJOB_KILL_AT is not set: returns at once
"""

from __future__ import annotations

import collections
import os
import signal

__all__ = ["KILL_AT_ENV", "POINTS", "point"]

KILL_AT_ENV = "JAXJOB_KILL_AT"
POINTS = (
    "epoch",  # inside an epoch, before its workspace is saved
    "save.copy",  # the device-to-host copy of a save has started
    "save.write",  # the background write has started
    "save.commit",  # the write is done, the commit has not happened
    "retention.delete",  # retention is deleting an old epoch
    "lock.takeover",  # a dead writer's lock is being taken over
)
_reached: collections.Counter[str] = collections.Counter()


def point(name: str) -> None:
    """Kills this process with SIGKILL if ``JAXJOB_KILL_AT`` names this point now."""
    wanted = os.environ.get(KILL_AT_ENV)
    if not wanted:
        return
    target, _, count = wanted.partition(":")
    if target != name:
        return
    _reached[name] += 1
    if _reached[name] == int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)
