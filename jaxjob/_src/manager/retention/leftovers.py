"""Leftovers of failed and killed saves and deletions: removed, or put back.

What a failed save left is removed when it fails and once more before the
next save (:class:`FailedSaves`); what a killed save or deletion left is
removed when the next writer starts, holding the node's lock (:func:`sweep`).
A committed epoch is never removed here.
"""

from __future__ import annotations

from jaxjob._src.base import fs
from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint.layout import is_committed, split_node_name
from jaxjob._src.manager.retention.deleting import DELETING, asides

__all__ = ["SUPERSEDED", "TMP_SUFFIX", "FailedSaves", "remove_failed", "sweep"]

logger = get_logger(__name__)

TMP_SUFFIX = ".orbax-checkpoint-tmp"  # Orbax's temporary directory: <final>.orbax-checkpoint-tmp
SUPERSEDED = ".superseded-"  # a committed epoch moved aside while the same epoch is saved again


def remove_failed(path: str) -> bool:
    """Removes what a failed save of the checkpoint ``path`` left (never the committed one).

    Returns:
        Whether nothing is left (a removal that failed is logged).
    """
    leftovers = asides(path, TMP_SUFFIX)
    if fs.is_remote(path) and fs.exists(path) and not is_committed(path):
        leftovers.append(path)
    removed = True
    for leftover in leftovers:
        try:
            fs.rmtree(leftover)
        except OSError as err:
            logger.warning("Could not remove %s of a failed save: %s", leftover, err)
            removed = False
    return removed


class FailedSaves:
    """What this writer's failed saves left, removed when they fail and once more later.

    A save can fail while Orbax's and TensorStore's threads are still at work
    on it (a failure surfaces as soon as one write fails; a directory is still
    being created in the background): a directory made after the first
    removal would stay behind (seen once under a full tmpfs). So the paths of
    failed saves are removed again before the next save starts and when the
    writer closes, once those threads are done.
    """

    def __init__(self) -> None:
        self._paths: list[str] = []

    def remove(self, path: str) -> None:
        """Removes what the failed save of ``path`` left, and remembers it for :meth:`retry`.

        Only local paths are retried: on object stores a saver that stopped
        answering may still be writing (the lock's sweep removes its leftovers).
        """
        remove_failed(path)
        if path not in self._paths and not fs.is_remote(path):
            self._paths.append(path)

    def retry(self, busy: str | None = None) -> None:
        """Removes again what the failed saves left, but for ``busy`` (a save in flight now).

        Paths that hold nothing more are forgotten.
        """
        self._paths = [p for p in self._paths if p == busy or not _retried(p)]


def _retried(path: str) -> bool:
    try:
        return remove_failed(path)
    except Exception as err:  # a cleanup retried later must not fail the save it precedes
        logger.warning("Could not list the leftovers of the failed save %s: %s", path, err)
        return False


def sweep(db_prefix: str, node_name: str, writing: int | None = None) -> list[str]:
    """Removes what killed saves and deletions of ``node_name`` left; call it holding the lock.

    Orbax's temporary directories, retention's ``.deleting-`` directories
    and uncommitted epoch directories are removed; an epoch moved aside for
    a save that never committed is put back.

    Returns:
        The names removed or put back (one INFO log line lists them).
    """
    done = []
    for name in fs.listdir(db_prefix):
        split = split_node_name(name, node_name)
        if split is None or split[0] == writing:
            continue
        path = fs.join(db_prefix, name)
        try:
            if _swept(path, fs.join(db_prefix, f"{node_name}.{split[0]}"), split[1]):
                done.append(name)
        except OSError as err:
            logger.warning("Could not remove the leftover %s: %s", path, err)
    if done:
        logger.info("Removed leftovers of killed saves under %s: %s", db_prefix, done)
    return done


def _swept(path: str, final: str, rest: str) -> bool:
    """Puts ``path`` back at ``final``, or removes it, if a killed save or deletion left it.

    Args:
        path: A directory of the node's epoch.
        final: The epoch's checkpoint directory.
        rest: What follows the epoch in ``path``'s name (empty for ``final`` itself).

    Returns:
        Whether ``path`` was a leftover.
    """
    if rest.startswith(SUPERSEDED) and not is_committed(final):
        if fs.exists(final):
            fs.rmtree(final)
        fs.rename(path, final)
    elif rest.startswith((TMP_SUFFIX, DELETING, SUPERSEDED)) or (
        not rest and not is_committed(path)
    ):
        fs.rmtree(path)
    else:
        return False
    return True
