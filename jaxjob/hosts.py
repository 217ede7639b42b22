"""Waiting on the other processes of a ``jax.distributed`` job, with timeouts that name who is late.

Every cross-host wait in jaxjob goes through :func:`exchange`: each process
posts a small JSON payload to the ``jax.distributed`` coordination service's
key-value store, waits at a barrier, up to a timeout, until every process
has posted, then reads all payloads with one directory read: O(N) requests
to the service per exchange (N sets, N barrier arrivals, N directory reads),
where reading each peer's key would take N^2. Processes make the same
sequence of calls (SPMD), so the n-th call of one process meets the n-th
call of every other. A process that does not arrive in time makes the
others raise :class:`HostTimeoutError`, which names it. With one process nothing is waited for.
"""

from jaxjob._src.multihost.hosts import DEFAULT_TIMEOUT_S as DEFAULT_TIMEOUT_S
from jaxjob._src.multihost.hosts import HostTimeoutError as HostTimeoutError
from jaxjob._src.multihost.hosts import decide as decide
from jaxjob._src.multihost.hosts import exchange as exchange

__all__ = ["DEFAULT_TIMEOUT_S", "HostTimeoutError", "decide", "exchange"]
