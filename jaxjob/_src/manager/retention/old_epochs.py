"""Retention of old epochs: the ``keep`` policies applied to a ``db_prefix``, the rest deleted.

An epoch is deleted for all the nodes together, only once a newer epoch has
committed for every node, never while it is being written, and never when
one of its manifests cannot be read (its ``keep.Best`` metric is unknown).
Only the process that deletes (:func:`~jaxjob._src.manager.save.supersede.deleting_process`)
calls :meth:`Retention.apply`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from jaxjob._src.base import fs
from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint import manifest
from jaxjob._src.checkpoint.layout import committed_epochs, common_epochs, db_name
from jaxjob._src.manager.retention import keep
from jaxjob._src.manager.retention.deleting import DELETING, asides, delete_epoch

__all__ = ["Retention"]

logger = get_logger(__name__)


class Retention:
    """Applies a ``keep`` policy to the epochs of some nodes under one ``db_prefix``.

    An epoch is deleted for all the nodes together. Call :meth:`apply` after
    a commit, on the one process that deletes.
    """

    def __init__(
        self, db_prefix: str, node_names: Sequence[str], policies: Sequence[keep.Policy]
    ) -> None:
        self.db_prefix = db_prefix
        self.node_names = list(node_names)
        self.policies = tuple(policies)
        self._metrics: dict[tuple[str, int], dict[str, float]] = {}  # (node, epoch): read once
        self._retry: set[str] = set()

    def doomed(self, writing: int | None = None) -> list[int]:
        """Committed epochs the policy drops: older than the newest common one, not kept."""
        per_node = {n: committed_epochs(self.db_prefix, n) for n in self.node_names}
        common = common_epochs(self.db_prefix, self.node_names)
        if not common:
            return []
        kept = keep.kept_records(self.policies, self._records(common)) | {writing}
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
        try:
            doomed = self.doomed(writing)
        except OSError as err:
            logger.warning(
                "Retention could not list %s (retried after the next commit): %s",
                self.db_prefix,
                err,
            )
            return []
        deleted = [epoch for epoch in doomed if self._delete(epoch)]
        if deleted:
            logger.info("Retention deleted epochs %s under %s", deleted, self.db_prefix)
        return deleted

    def _delete(self, epoch: int) -> bool:
        """Deletes ``epoch`` of every node; whether every deletion succeeded."""
        paths = [db_name(epoch, n, self.db_prefix) for n in self.node_names]
        return all([self._remove(p, delete_epoch) for p in paths if fs.exists(p)])

    def _remove(self, path: str, how: Callable[[str], None]) -> bool:
        try:
            how(path)
        except OSError as err:
            logger.warning("Could not delete %s (retried after the next commit): %s", path, err)
            self._retry.add(path)
            for aside in asides(path, DELETING):
                self._retry.add(aside)
            return False
        return True

    def _records(self, epochs: Sequence[int]) -> list[keep.EpochRecord]:
        """A record of each of ``epochs``; metrics are read only for ``keep.Best`` policies."""
        if not keep.metric_names(self.policies):
            return [keep.EpochRecord(epoch) for epoch in epochs]
        return [self._record(epoch) for epoch in epochs]

    def _record(self, epoch: int) -> keep.EpochRecord:
        """``epoch``'s metrics over its nodes; unreadable if one manifest could not be read."""
        metrics: dict[str, float] = {}
        readable = True
        for node in self.node_names:
            if (node, epoch) not in self._metrics:
                found = _read_metrics(db_name(epoch, node, self.db_prefix))
                if found is None:
                    readable = False
                    continue
                self._metrics[node, epoch] = found
            metrics.update(self._metrics[node, epoch])
        return keep.EpochRecord(epoch, metrics, readable)


def _read_metrics(path: str) -> dict[str, float] | None:
    """The metrics in the manifest of ``path``; None (logged) if it cannot be read."""
    try:
        return manifest.read(path).metrics
    except (OSError, ValueError) as err:
        logger.warning("Retention keeps %s: its manifest cannot be read: %s", path, err)
        return None
