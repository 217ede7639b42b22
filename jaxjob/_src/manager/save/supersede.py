"""Replacing a committed epoch (moved aside, then deleted or put back), and who deletes."""

from __future__ import annotations

import time
from collections.abc import Iterable

from jaxjob._src.base import fs
from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint.layout import is_committed

__all__ = ["deleting_process", "move_aside", "put_back", "remove_superseded"]

logger = get_logger(__name__)


def deleting_process(owners: Iterable[int | None]) -> int:
    """The one process that deletes for nodes of these ``owner_process`` es (None: every process).

    Their one owner, else process 0: a node's own owner cleans up after its
    saves, and retention of nodes saved by several processes runs on process 0.

    Example:
        >>> deleting_process([3, 3]), deleting_process([3, None]), deleting_process([])
        (3, 0, 0)
    """
    found = set(owners)
    owner = found.pop() if len(found) == 1 else None
    return owner or 0


def move_aside(path: str) -> str | None:
    """Moves whatever is at ``path`` out of the way of a new save; returns where it went.

    A committed checkpoint is renamed aside on local disk (put back if the new
    save fails, deleted once it commits); on object stores, which cannot
    rename, it is deleted. Anything else at ``path`` is not a checkpoint
    (an interrupted commit-file save): it is deleted.
    """
    if not fs.exists(path):
        return None
    if is_committed(path) and not fs.is_remote(path):
        aside = f"{path}.superseded-{time.time_ns()}"
        fs.rename(path, aside)
        return aside
    if is_committed(path):
        logger.warning(
            "Replacing the committed checkpoint %s: object stores cannot rename, "
            "so the old one is deleted before the new one is written",
            path,
        )
    fs.rmtree(path)
    return None


def put_back(path: str, superseded: str | None) -> None:
    """After a failed save, returns the epoch it was replacing (moved to ``superseded``)."""
    if superseded and not fs.exists(path):
        fs.rename(superseded, path)


def remove_superseded(path: str) -> None:
    """Deletes the checkpoint a committed save replaced; a failure is logged."""
    try:
        fs.rmtree(path)
    except OSError as err:
        logger.warning("could not remove the superseded checkpoint %s: %s", path, err)
