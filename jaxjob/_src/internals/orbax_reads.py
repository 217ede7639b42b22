"""How Orbax reads: into 64-byte aligned buffers, in event loops closed only once idle.

Two private module functions of Orbax are replaced by :func:`install`; Orbax
looks both up on their modules at each call:

* **Restore without a second copy on CPU**: ``serialization._read_shard``
  becomes :func:`jaxjob._src.internals.restore_buffers.read_shard` (a copy of
  it reading into 64-byte aligned buffers, which XLA's CPU client uses in
  place).
* **No read left in flight on a closed event loop**:
  ``asyncio_utils._run_sync_via_new_loop`` (Orbax 0.12.5 and later; 0.12.1
  to 0.12.4 use ``asyncio.run``) becomes :func:`_run_to_the_end`.

Private Orbax names used here: ``serialization`` (module) and its
``_read_shard`` (replaced), ``asyncio_utils`` (module) and its
``_run_sync_via_new_loop`` (replaced).
"""

from __future__ import annotations

import asyncio
from typing import Any

from orbax.checkpoint._src import asyncio_utils
from orbax.checkpoint._src.serialization import serialization

from jaxjob._src.internals import orbax_version
from jaxjob._src.internals.restore_buffers import read_shard

__all__ = ["install"]

orbax_version.check()


def install() -> None:
    """Puts :func:`read_shard` and :func:`_run_to_the_end` in place of Orbax's (idempotent)."""
    serialization._read_shard = read_shard
    if hasattr(asyncio_utils, "_run_sync_via_new_loop"):  # Orbax 0.12.5+ (asyncio.run before)
        asyncio_utils._run_sync_via_new_loop = _run_to_the_end


def _run_to_the_end(coro: Any) -> Any:
    """Orbax's ``asyncio_utils._run_sync_via_new_loop``, closing its loop only once it is idle.

    Orbax runs each synchronous read or write in a fresh event loop and
    closes it as soon as the top coroutine returns. When one of the reads it
    gathers fails (a checkpoint that a live writer's retention deleted
    meanwhile), the others are still in flight: their TensorStore futures
    and worker threads later deliver their results to the closed loop, which
    printed ``RuntimeError: Event loop is closed`` tracebacks (and ``Exception
    ignored`` for the coroutines destroyed pending). Here the loop first runs
    every task left on it to its end (their exceptions retrieved), then closes.
    """
    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        try:
            _finish_tasks(loop)
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _finish_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Runs ``loop`` until no task is left on it (a task may start others meanwhile)."""
    pending = asyncio.all_tasks(loop)
    while pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        pending = asyncio.all_tasks(loop)
