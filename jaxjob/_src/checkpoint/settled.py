"""A save's write futures as one: its failure surfaces once every write of that save is done.

Orbax's background thread waits on a save's commit futures one after the
other and stops at the first that fails; the others (TensorStore's writes of
the other leaves and items) go on. jaxjob removes a failed save's temporary
directory as soon as the failure surfaces, so a write still running then
created the directory again and left it behind (seen under a full tmpfs).
:class:`Settled` waits for all of them, then raises the first failure.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from jaxjob._src.base.log import get_logger

__all__ = ["Settled"]

logger = get_logger(__name__)


class _Future(Protocol):
    def result(self, timeout: float | None = None) -> Any: ...


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

    def __init__(self, futures: Sequence[_Future]) -> None:
        self._futures = list(futures)

    def result(self, timeout: float | None = None) -> None:
        """Waits for every future (within ``timeout`` seconds in all); raises the first failure.

        Raises:
            Exception: The first future's failure, once the others are done or timed out.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        first: Exception | None = None
        for future in self._futures:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                future.result(timeout=left)
            except Exception as err:  # kept: raised once the others are done
                if first is None:
                    first = err
                else:
                    logger.debug("another write of the failed save failed too: %s", err)
        if first is not None:
            raise first
