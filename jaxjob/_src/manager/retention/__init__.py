"""Retention: which old epochs a writer keeps, and deleting the rest and what failed saves left.

What retention guarantees
-------------------------
* **The policies decide, within bounds.** ``keep`` (:mod:`jaxjob.keep`:
  ``Last``, ``Every``, ``Best``; their union) selects from one typed record
  per committed epoch (:class:`~jaxjob._src.manager.retention.keep.EpochRecord`).
  Whatever they say, the newest committed epoch, an epoch being written and
  an epoch whose manifest cannot be read are kept, and an epoch is deleted
  only once a newer one has committed for every node; the nodes of a
  multi-node manager lose an epoch together.
* **A deletion never leaves a committed-looking checkpoint.** An epoch stops
  being committed first (renamed aside on local disk, its commit marker
  deleted on object stores), and only then are its files removed.
* **Nothing is left behind for long.** A failed deletion is logged (never
  raised) and retried after the next commit; what a failed save left is
  removed when it fails and once more before the next save; what a killed
  save or deletion left is removed (or an epoch moved aside put back) when
  the next writer takes the node's lock.
* **One deleter.** Only the process holding the node's lock (process 0, or
  the node's owner process) deletes.

The package
-----------
* ``keep.py``: the policies over epoch records (public as :mod:`jaxjob.keep`);
* ``metrics.py``: the scalars a save stores in its manifest, which ``Best`` ranks by;
* ``old_epochs.py``: :class:`Retention`, the policies applied to a ``db_prefix``;
* ``deleting.py``: :func:`delete_epoch`, uncommitted first, then removed;
* ``leftovers.py``: :class:`FailedSaves` and :func:`sweep`, what failed and killed saves left;
* ``notice.py``: :class:`KeepAllNotice`, ``keep=None``'s one notice past 1 GiB.
"""

from jaxjob._src.manager.retention.deleting import delete_epoch as delete_epoch
from jaxjob._src.manager.retention.leftovers import FailedSaves as FailedSaves
from jaxjob._src.manager.retention.leftovers import remove_failed as remove_failed
from jaxjob._src.manager.retention.leftovers import sweep as sweep
from jaxjob._src.manager.retention.metrics import metrics_of as metrics_of
from jaxjob._src.manager.retention.notice import KeepAllNotice as KeepAllNotice
from jaxjob._src.manager.retention.old_epochs import Retention as Retention

__all__ = [
    "FailedSaves",
    "KeepAllNotice",
    "Retention",
    "delete_epoch",
    "metrics_of",
    "remove_failed",
    "sweep",
]
