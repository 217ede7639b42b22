"""Deleting a committed epoch so that it stops being committed first, then its files.

* On local disk ``<node>.<e>`` is renamed to ``<node>.<e>.deleting-<ns>``
  (one atomic rename), then that directory is removed;
* on object stores, which cannot rename, the commit marker
  (``commit_success.txt``) is deleted first, then the rest of the prefix.

A deletion cut short never leaves something that looks like a committed checkpoint.
"""

from __future__ import annotations

import time

from jaxjob._src.base import faults, fs
from jaxjob._src.checkpoint.layout import COMMIT_MARKER

__all__ = ["DELETING", "asides", "delete_epoch"]

DELETING = ".deleting-"  # an epoch being deleted (local disk)


def delete_epoch(path: str) -> None:
    """Makes the checkpoint ``path`` uncommitted, then removes its files.

    Raises:
        OSError: If either step fails (the caller retries later).
    """
    if fs.is_remote(path):
        fs.remove(fs.join(path, COMMIT_MARKER))
        faults.point("retention.delete")
        fs.rmtree(path)
        return
    aside = f"{path}{DELETING}{time.time_ns()}"
    fs.rename(path, aside)
    fs.fsync_dir(path.rpartition("/")[0])
    faults.point("retention.delete")
    fs.rmtree(aside)


def asides(path: str, marker: str) -> list[str]:
    """The siblings of ``path`` named ``<its name><marker>...`` (moved aside, or temporary)."""
    parent, _, base = path.rpartition("/")
    return [fs.join(parent, n) for n in fs.listdir(parent) if n.startswith(base + marker)]
