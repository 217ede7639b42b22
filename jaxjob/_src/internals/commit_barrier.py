"""Orbax's commit barriers of a shared save, ended at once when a process's write fails.

In a multi-process job every process writes its part of a shared checkpoint,
then Orbax's background thread waits at a barrier (``async_write_complete``)
before the primary process commits. A process whose write fails never comes
to that barrier, so the others used to wait there for the whole write timeout
(``write_timeout_s``) before their save failed too. Here the barrier is one
of jaxjob's, kept in the coordination service's key-value store: each process
posts its arrival, and a process whose write failed posts its failure
(:func:`post_failure`) for the same barrier; the others then fail the save at
once, naming that process and its error.

The barrier's key is Orbax's: ``[<prefix>_]async_write_complete.<directory>``
(``orbax.checkpoint._src.multihost.unique_barrier_key``), which a shared save
uses once per directory name: failures are posted by that name. A count of
this process's uses of each key and name keeps a second save of one name (a
new ``train`` in the same job) apart from the first. It serves the shared saves of
a multi-process job only: a private save (one process) has no barrier.
"""

from __future__ import annotations

import collections
import threading
import time

import jax

from jaxjob._src.base import jax_private

__all__ = ["WRITE_BARRIER", "post_failure", "wait", "write_directory"]

WRITE_BARRIER = "async_write_complete"  # Orbax's barrier between the writes and the commit
_PREFIX = "jaxjob_commit"
_POLL_S = (0.002, 0.1)  # the first and the longest pause between two looks
_uses: collections.Counter[str] = collections.Counter()
_lock = threading.Lock()


def _use(key: str) -> int:
    with _lock:
        _uses[key] += 1
        return _uses[key]


def write_directory(key: str) -> str | None:
    """The directory whose writes the barrier ``key`` waits for, if it is a write barrier.

    Example:
        >>> write_directory("_async_write_complete.local.3"), write_directory("other.local.3")
        ('local.3', None)
    """
    before, found, name = key.partition(f"{WRITE_BARRIER}.")
    return name if found and not before.rstrip("_").count(".") else None


def post_failure(directory_name: str, error: BaseException) -> None:
    """Tells the processes waiting for the writes into ``directory_name`` that this one's failed.

    This process then never waits at that save's write barrier; its use of
    the name counts.
    """
    use, me = _use(f"failed/{directory_name}"), jax.process_index()
    text = f"{type(error).__name__}: {error}"[:2000]
    client = jax_private.distributed_client()
    client.key_value_set(f"{_PREFIX}/failed/{directory_name}/{use}/{me}", text)


def wait(*, key: str, timeout_ms: int) -> None:
    """Orbax's ``barrier_sync_fn``: returns once every process came to the barrier ``key``.

    Raises:
        RuntimeError: At once if a process posted the failure of its write
            for this barrier (naming it and its error).
        TimeoutError: Once ``timeout_ms`` have passed (naming the processes
            that never came), as Orbax's own barrier did.
    """
    client, me, count = jax_private.distributed_client(), jax.process_index(), jax.process_count()
    root = f"{_PREFIX}/{key}/{_use(key)}"
    name = write_directory(key)
    failures = f"{_PREFIX}/failed/{name}/{_use(f'failed/{name}')}/" if name else None
    client.key_value_set(f"{root}/arrived/{me}", "")
    deadline, pause = time.monotonic() + timeout_ms / 1000, _POLL_S[0]
    while True:
        failed = client.key_value_dir_get(failures) if failures else []
        if failed:
            raise RuntimeError(_failed_message(key, failed))
        arrived = {
            int(k.rpartition("/")[2]) for k, _ in client.key_value_dir_get(f"{root}/arrived/")
        }
        if len(arrived) >= count:
            return
        if time.monotonic() > deadline:
            missing = sorted(set(range(count)) - arrived)
            raise TimeoutError(
                f"the save's barrier {key!r} timed out after {timeout_ms / 1000:g} s: processes "
                f"{missing} never finished their writes (see write_timeout_s)"
            )
        time.sleep(pause)
        pause = min(2 * pause, _POLL_S[1])


def _failed_message(key: str, failed: list[tuple[str, str]]) -> str:
    named = "; ".join(f"process {k.rpartition('/')[2]}: {v}" for k, v in sorted(failed))
    return f"the save's write failed on another process ({named}) at the barrier {key!r}"
