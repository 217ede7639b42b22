"""Waiting on the other processes of a ``jax.distributed`` job, with timeouts that name who is late.

Public as :mod:`jaxjob.hosts`, whose docstring says more.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import jax

from jaxjob._src.base import errors, jax_private
from jaxjob._src.base.log import get_logger

__all__ = ["DEFAULT_TIMEOUT_S", "HostTimeoutError", "decide", "exchange"]

logger = get_logger(__name__)

DEFAULT_TIMEOUT_S = 300.0
_PREFIX = "jaxjob/exchange"
_calls = itertools.count()


class HostTimeoutError(TimeoutError):
    """Some processes did not reach a cross-host wait in time; ``missing`` lists them."""

    __module__ = "jaxjob"  # its public name: tracebacks and pickles say jaxjob.X

    def __init__(self, what: str, missing: list[int], timeout_s: float) -> None:
        super().__init__(
            f"[process={jax.process_index()}] timed out after {timeout_s:g} s waiting for "
            f"processes {missing} of {jax.process_count()} at {what}; they did not arrive "
            "(crashed, hung, or running a different job)"
        )
        self.missing = missing
        self.timeout_s = timeout_s

    def __reduce__(self) -> tuple[Any, ...]:
        return errors.pickled(self)


def _client() -> Any:
    return jax_private.distributed_client()


def exchange(what: str, payload: dict[str, Any], *, timeout_s: float) -> list[dict[str, Any]]:
    """Posts ``payload`` and returns every process's payload, in process order.

    Args:
        what: Names the wait in errors (e.g. ``"save of epoch 3"``); every
            process must pass the same.
        payload: This process's JSON-serializable payload.
        timeout_s: How long to wait for the other processes.

    Raises:
        HostTimeoutError: Naming the processes that did not arrive in time.
        RuntimeError: If another process was at a different wait.

    Example:
        >>> import jaxjob
        >>> jaxjob.hosts.exchange("a check", {"epoch": 3}, timeout_s=1.0)
        [{'epoch': 3}]
    """
    if jax.process_count() == 1:
        return [payload]
    client, call, me = _client(), next(_calls), jax.process_index()
    client.key_value_set(f"{_PREFIX}/{call}/{me}", json.dumps({"what": what, "payload": payload}))
    if call >= 2:  # every peer has read call-2: it reached the barrier of call-1
        client.key_value_delete(f"{_PREFIX}/{call - 2}/{me}")
    _barrier(client, call, what, timeout_s)
    posts = _posts(client, call)
    diverged = {p["what"] for p in posts} - {what}
    if diverged:
        raise RuntimeError(
            f"[process={me}] processes diverged: this one is at {what!r}, others at "
            f"{sorted(diverged)}; every process must run the same job"
        )
    return [p["payload"] for p in posts]


def _barrier(client: Any, call: int, what: str, timeout_s: float) -> None:
    """Waits until every process has posted its payload of ``call``: O(N) requests in all."""
    try:
        client.wait_at_barrier(f"{_PREFIX}/{call}", max(1, int(timeout_s * 1000)))
    except jax.errors.JaxRuntimeError as err:
        if not jax_private.timed_out(err):
            raise
        raise HostTimeoutError(what, _missing(client, call), timeout_s) from None


def _posted(client: Any, call: int) -> dict[int, str]:
    """The posts of ``call`` present in the key-value store, by process, with one directory read."""
    return {
        int(key.rsplit("/", 1)[1]): raw
        for key, raw in client.key_value_dir_get(f"{_PREFIX}/{call}/")
    }


def _posts(client: Any, call: int) -> list[dict[str, Any]]:
    """Every process's post of ``call``, in process order (after the barrier: all present)."""
    found = _posted(client, call)
    return [json.loads(found[process]) for process in range(jax.process_count())]


def _missing(client: Any, call: int) -> list[int]:
    arrived = _posted(client, call)
    return [p for p in range(jax.process_count()) if p not in arrived]


def decide(what: str, fn: Callable[[], Any], *, timeout_s: float) -> Any:
    """Runs ``fn`` on process 0 only and returns its JSON-serializable result on every process.

    Raises:
        HostTimeoutError: Naming the processes that did not arrive in time.
        RuntimeError: On every other process, if ``fn`` raised on process 0
            (process 0 raises the original error).

    Example:
        >>> import jaxjob
        >>> jaxjob.hosts.decide("the resume epoch", lambda: 4, timeout_s=1.0)
        4
    """
    if jax.process_index() != 0:
        post = exchange(what, {}, timeout_s=timeout_s)[0]
        if "error" in post:
            raise RuntimeError(f"process 0 failed deciding {what}: {post['error']}")
        return post["value"]
    try:
        value = fn()
    except Exception as err:
        exchange(what, {"error": f"{type(err).__name__}: {err}"}, timeout_s=timeout_s)
        raise
    exchange(what, {"value": value}, timeout_s=timeout_s)
    return value
