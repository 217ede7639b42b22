"""The lock record's one interface: read it, or change it atomically; two backends keep it.

A :class:`Record` is kept by :class:`~jaxjob._src.manager.lock.local_file.LocalRecord`
(a file changed under an exclusive ``flock``) on local and network disks, and by
:class:`~jaxjob._src.manager.lock.object_store.RemoteRecord` (every change
conditional on the version read) on ``gs://`` and ``s3://``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from jaxjob._src.manager.lock.holder import Holder

__all__ = ["Change", "Lost", "Record"]

Change = Callable[[Holder | None], Holder | None]  # the record as read -> as written (None: gone)


class Lost(Exception):
    """Another writer changed the lock record between this process's read and its write."""


@runtime_checkable
class Record(Protocol):
    """Where one lock's record is kept."""

    path: str

    def read(self) -> Holder | None:
        """The record as it stands; None if there is none."""
        ...

    def change(self, fn: Change, *, create: bool = False) -> Holder | None:
        """Replaces the record by ``fn(record)`` atomically (None deletes it); returns it.

        Args:
            fn: The change; it may raise to change nothing.
            create: Whether a missing record may be created (taking the lock).

        Raises:
            Lost: If another writer changed the record after it was read.
            FileNotFoundError: If ``create`` is false and a local record is gone.
            OSError: If the store failed, or did not answer in time.
        """
        ...
