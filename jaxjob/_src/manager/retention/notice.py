"""The one notice that ``keep=None`` keeps every epoch, once a run has written 1 GiB."""

from __future__ import annotations

import jax

from jaxjob._src.base.status import status_logger

__all__ = ["KEEP_ALL_NOTICE_BYTES", "KeepAllNotice"]

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
