"""A save's write futures as one: its failure surfaces once every write of that save is done.

Orbax's background thread waits on a save's commit futures one after the
other and stops at the first that fails; the others (TensorStore's writes of
the other leaves and items) go on. So does each of Orbax's chained futures
(the PyTree handler returns its writes as one: the sharding file's first, the
arrays' after it). jaxjob removes a failed save's temporary directory as soon
as the failure surfaces, so a write still running then created the directory
again and left it behind (seen under a full tmpfs: the arrays' write after the
sharding file's failed). :class:`Settled` waits for all of them, the members
of chained futures included, then raises the first failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from jaxjob._src.base import faults
from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint.layout import get_ckpt_filename, parse_name
from jaxjob._src.internals import commit_barrier

__all__ = ["FailPoint", "Settled", "post_failure"]

logger = get_logger(__name__)


class _Future(Protocol):
    def result(self, timeout: float | None = None) -> Any: ...


class FailPoint:
    """A commit future whose wait passes the fail point ``name`` (see ``base.faults``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def result(self, timeout: float | None = None) -> None:
        """Passes the fail point."""
        faults.point(self.name)


class Settled:
    """Futures waited for together: every one settles before the first failure is raised.

    Example:
        >>> import concurrent.futures, time
        >>> pool = concurrent.futures.ThreadPoolExecutor(2)
        >>> def fail():
        ...     raise OSError("disk full")
        >>> slow = pool.submit(time.sleep, 0.2)
        >>> try:
        ...     Settled([pool.submit(fail), slow]).result()
        ... except OSError as err:
        ...     print(err, slow.done())
        disk full True
    """

    def __init__(
        self,
        futures: Sequence[_Future],
        *,
        members: Sequence[_Future] = (),
        on_failure: Callable[[Exception], None] | None = None,
    ) -> None:
        """Waits for ``futures``; ``on_failure`` hears of the first failure before it is raised.

        ``members``: what ``futures`` wait on in turn (a chained future's
        members), each waited for too once one of ``futures`` has failed.
        """
        self._futures = list(futures)
        self._members = list(members)
        self._on_failure = on_failure

    def result(self, timeout: float | None = None) -> None:
        """Waits for every future (within ``timeout`` seconds in all); raises the first failure.

        Raises:
            Exception: The first future's failure, once the others are done or timed out.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        first = _first_failure(self._futures, deadline)
        if first is not None:
            _first_failure(self._members, deadline)  # a failed chain left its later members
            if self._on_failure is not None:
                self._on_failure(first)
            raise first


def _first_failure(futures: Sequence[_Future], deadline: float | None) -> Exception | None:
    """Waits for each of ``futures`` (until ``deadline``); the first failure, or None."""
    first: Exception | None = None
    for future in futures:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            future.result(timeout=left)
        except Exception as err:  # kept: raised once the others are done
            if first is None:
                first = err
            else:
                logger.debug("another write of the failed save failed too: %s", err)
    return first


def post_failure(directory: Any) -> Callable[[Exception], None]:
    """Where a shared save into ``directory`` (its temporary one) posts its failed write.

    The other processes of the job wait for this process's write at Orbax's
    barrier, which then ends at once (:mod:`~jaxjob._src.internals.commit_barrier`).
    """
    entry = parse_name(str(directory).rstrip("/").rpartition("/")[2])
    name = get_ckpt_filename(entry.node, entry.epoch) if entry else str(directory)
    return lambda err: commit_barrier.post_failure(name, err)
