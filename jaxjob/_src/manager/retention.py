"""Deleting what a writer no longer needs: old epochs (retention) and leftovers of killed saves.

An epoch is deleted so that it stops being committed first, and only then
are its files removed, so a deletion cut short never leaves something that
looks like a committed checkpoint:

* on local disk ``<node>.<e>`` is renamed to ``<node>.<e>.deleting-<ns>``
  (one atomic rename), then that directory is removed;
* on object stores, which cannot rename, the commit marker
  (``commit_success.txt``) is deleted first, then the rest of the prefix.

What a killed deletion leaves is removed after the next commit, or when the
next writer starts (:func:`sweep`). Only the process holding the node's lock
(process 0, or the node's owner process) calls anything here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxjob._src.base import faults, fs
from jaxjob._src.base.log import get_logger
from jaxjob._src.base.status import status_logger
from jaxjob._src.checkpoint import manifest
from jaxjob._src.checkpoint.layout import (
    COMMIT_MARKER,
    committed_epochs,
    common_epochs,
    db_name,
    is_committed,
    split_node_name,
)
from jaxjob._src.manager import keep

__all__ = ["FailedSaves", "Retention", "delete_epoch", "metrics_of", "remove_failed", "sweep"]

logger = get_logger(__name__)

TMP_SUFFIX = ".orbax-checkpoint-tmp"  # Orbax's temporary directory: <final>.orbax-checkpoint-tmp
DELETING = ".deleting-"  # an epoch being deleted (local disk)
SUPERSEDED = ".superseded-"  # a committed epoch moved aside while the same epoch is saved again


def metrics_of(
    names: Sequence[str], outputs: Mapping[str, Any], state: Mapping[str, Any]
) -> dict[str, float]:
    """The finite numeric scalars among ``outputs``, and ``names`` (outputs first, else ``state``).

    Raises:
        ValueError: If one of ``names`` is present but not a numeric scalar.
    """
    found: dict[str, float] = {}
    for name, value in outputs.items():
        if (scalar := _scalar(value)) is not None:
            found[name] = scalar
    for name in names:
        value = outputs[name] if name in outputs else state.get(name)
        if value is None:
            continue
        if (scalar := _scalar(value)) is None:
            raise ValueError(
                f"keep=Best({name!r}) ranks by a numeric scalar, but {name!r} is "
                f"{type(value).__name__} of shape {np.shape(value)}; return a scalar under "
                "that name"
            )
        found[name] = scalar
    # NaN and inf are not ranked (keep.Best) and not stored: a manifest holds finite numbers
    return {name: value for name, value in found.items() if math.isfinite(value)}


def _scalar(value: Any) -> float | None:
    if isinstance(value, jax.Array):
        value = value.addressable_data(0)
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):
        return None
    numeric = np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    if array.size != 1 or not numeric:
        return None
    return float(array.reshape(()))


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


class Retention:
    """Applies a ``keep`` policy to the epochs of some nodes under one ``db_prefix``.

    An epoch is deleted for all the nodes together. Call :meth:`apply` after
    a commit, on the one process that deletes.
    """

    def __init__(self, db_prefix: str, node_names: Sequence[str], policies: Sequence[Any]) -> None:
        self.db_prefix = db_prefix
        self.node_names = list(node_names)
        self.policies = tuple(policies)
        self._metrics: dict[tuple[str, int], dict[str, float]] = {}
        self._retry: set[str] = set()

    def doomed(self, writing: int | None = None) -> list[int]:
        """Committed epochs the policy drops: older than the newest common one, not kept."""
        per_node = {n: committed_epochs(self.db_prefix, n) for n in self.node_names}
        common = common_epochs(self.db_prefix, self.node_names)
        if not common:
            return []
        metrics, unknown = self._epoch_metrics(common)
        kept = keep.kept(self.policies, common, metrics) | {writing} | unknown
        every = set().union(*per_node.values())
        return sorted(e for e in every if e < common[-1] and e not in kept)

    def apply(self, writing: int | None = None) -> list[int]:
        """Deletes the epochs :meth:`doomed` names; retries earlier failed deletions.

        Never raises: a failed deletion is logged and retried at the next call.

        Returns:
            The epochs deleted.
        """
        for path in sorted(self._retry):
            self._retry.discard(path)
            if fs.exists(path):
                self._remove(path, fs.rmtree)
        deleted = []
        try:
            doomed = self.doomed(writing)
        except OSError as err:
            logger.warning(
                "Retention could not list %s (retried after the next commit): %s",
                self.db_prefix,
                err,
            )
            return []
        for epoch in doomed:
            paths = [db_name(epoch, n, self.db_prefix) for n in self.node_names]
            results = [self._remove(p, delete_epoch) for p in paths if fs.exists(p)]
            if all(results):
                deleted.append(epoch)
        if deleted:
            logger.info("Retention deleted epochs %s under %s", deleted, self.db_prefix)
        return deleted

    def _remove(self, path: str, how: Any) -> bool:
        try:
            how(path)
        except OSError as err:
            logger.warning("Could not delete %s (retried after the next commit): %s", path, err)
            self._retry.add(path)
            for aside in _asides(path, DELETING):
                self._retry.add(aside)
            return False
        return True

    def _epoch_metrics(self, epochs: Sequence[int]) -> tuple[dict[int, dict[str, float]], set[int]]:
        """Each epoch's metrics, and the epochs whose manifest could not be read (kept)."""
        merged: dict[int, dict[str, float]] = {}
        unknown: set[int] = set()
        if not keep.metric_names(self.policies):
            return merged, unknown
        for epoch in epochs:
            for node in self.node_names:
                if (node, epoch) not in self._metrics:
                    found = _read_metrics(db_name(epoch, node, self.db_prefix))
                    if found is None:
                        unknown.add(epoch)
                        continue
                    self._metrics[node, epoch] = found
                merged.setdefault(epoch, {}).update(self._metrics[node, epoch])
        return merged, unknown


def _read_metrics(path: str) -> dict[str, float] | None:
    """The metrics in the manifest of ``path``; None (logged) if it cannot be read."""
    try:
        return manifest.read(path).metrics
    except (OSError, ValueError) as err:
        logger.warning("Retention keeps %s: its manifest cannot be read: %s", path, err)
        return None


def _asides(path: str, marker: str) -> list[str]:
    parent, _, base = path.rpartition("/")
    return [fs.join(parent, n) for n in fs.listdir(parent) if n.startswith(base + marker)]


def remove_failed(path: str) -> bool:
    """Removes what a failed save of the checkpoint ``path`` left (never the committed one).

    Returns:
        Whether nothing is left (a removal that failed is logged).
    """
    leftovers = _asides(path, TMP_SUFFIX)
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
        epoch, rest = split
        final = fs.join(db_prefix, f"{node_name}.{epoch}")
        path = fs.join(db_prefix, name)
        try:
            if rest.startswith(SUPERSEDED) and not is_committed(final):
                if fs.exists(final):
                    fs.rmtree(final)
                fs.rename(path, final)
            elif rest.startswith((TMP_SUFFIX, DELETING, SUPERSEDED)) or (
                not rest and not is_committed(path)
            ):
                fs.rmtree(path)
            else:
                continue
        except OSError as err:
            logger.warning("Could not remove the leftover %s: %s", path, err)
            continue
        done.append(name)
    if done:
        logger.info("Removed leftovers of killed saves under %s: %s", db_prefix, done)
    return done


KEEP_ALL_NOTICE_BYTES = 1 << 30  # keep=None: the run says so once it has written this much


class KeepAllNotice:
    """Says once, on the status line, that ``keep=None`` keeps every epoch it wrote past 1 GiB.

    Example:
        >>> notice = KeepAllNotice("/ckpt")
        >>> notice.saved(512 << 20), notice.saved(512 << 20), notice.saved(1 << 30)
        (False, True, False)
    """

    def __init__(self, db_prefix: str) -> None:
        self.db_prefix = db_prefix
        self._written = 0
        self._said = False

    def saved(self, nbytes: int) -> bool:
        """Counts a save of ``nbytes`` (every process's); whether this one made it say so."""
        self._written += nbytes
        if self._said or self._written < KEEP_ALL_NOTICE_BYTES:
            return False
        self._said = True
        if jax.process_index() == 0:
            status_logger().info(
                "keep=None keeps every epoch: this run has written %.1f GiB of checkpoints "
                "under %s; pass keep=jaxjob.keep.Last(n) (or Every, Best) to bound it",
                self._written / (1 << 30), self.db_prefix,
            )  # fmt: skip
        return True
