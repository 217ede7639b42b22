"""Starting a small save's Orbax pipeline on a long-lived worker thread.

Orbax's synchronous part of an async save costs ~10 ms whatever its size (a
new event loop per call, ~20 thread starts, the replica slices of each
leaf: ``benchmarks/README.md``), and more on a busy machine, where each
thread start waits for a core: 75-125 ms for a 56-leaf 82 MiB transformer
state on 2 busy cores, against ~12 ms for the copy below. For a checkpoint
of up to :data:`SMALL_SAVE_BYTES` that is most of what the training thread
would feel, so :class:`NodeWriter` hands it to one worker thread per process
instead. The training thread first makes the save's own copy of its leaves
(:func:`detach`): a step that donates a buffer right after ``save()``
returns cannot change, or free, what the worker has not yet handed to
Orbax. The copy is why only saves of up to :data:`SMALL_SAVE_BYTES`
(128 MiB) take this path: a larger one would hold twice the workspace
(above it, Orbax's writes read the workspace's own buffers, with no second
copy on the CPU). The format, the checksums, the commit and its durability
are the same as the training thread's own start; a failure of the start is
reported like a failure of the background write (when the save is
finished: by the next save or ``wait_until_finished``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import numpy as np

from jaxjob._src.base import fs

__all__ = ["SMALL_SAVE_BYTES", "detach", "eligible", "exclusive", "submit"]

# Saves of at most this many bytes (this process's) start on the worker thread: the most
# the save's own copy holds beside the workspace, on its devices, while Orbax starts.
SMALL_SAVE_BYTES = 128 * 2**20


def eligible(
    path: str, nbytes: int | None, *, async_save: bool, max_host_bytes: int | None = None
) -> bool:
    """Whether the save of ``nbytes`` to ``path`` starts on the worker thread.

    An async save of at most :data:`SMALL_SAVE_BYTES` to a local filesystem in a
    one-process job, and within ``max_host_bytes`` (its copy is held beside the
    workspace). Object stores keep their bounded start on the training
    thread, and a multi-process save its barriers in step with the job's
    other collectives.

    Example:
        >>> eligible("/tmp/ckpt", 2**20, async_save=True, max_host_bytes=2**19)
        False
    """
    if not async_save or nbytes is None or nbytes > SMALL_SAVE_BYTES:
        return False
    if max_host_bytes is not None and nbytes > max_host_bytes:
        return False
    return jax.process_count() == 1 and not fs.is_remote(path)


def detach(encoded: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The save's own copy of each item's leaves: what the caller may donate or change.

    ``jax.Array`` leaves are copied on their devices with their shardings
    (one batched ``jax.device_put``), NumPy arrays on the host; other leaves
    (Python scalars) are immutable.

    Example:
        >>> import jax.numpy as jnp
        >>> x = jnp.arange(3)
        >>> copy = detach({"state": {"x": x}})["state"]["x"]
        >>> bool((copy == x).all()), copy is x
        (True, False)
    """
    arrays = [
        (item, name, leaf)
        for item, leaves in encoded.items()
        for name, leaf in leaves.items()
        if isinstance(leaf, jax.Array)
    ]
    copies = (
        jax.device_put([a for *_, a in arrays], [a.sharding for *_, a in arrays], may_alias=False)
        if arrays
        else []
    )
    out = {
        item: {
            name: np.array(leaf, copy=True) if isinstance(leaf, np.ndarray) else leaf
            for name, leaf in leaves.items()
        }
        for item, leaves in encoded.items()
    }
    for (item, name, _), copy in zip(arrays, copies, strict=True):
        out[item][name] = copy
    return out


_LOCK = threading.Lock()  # one Orbax start at a time in this process
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_made = threading.Lock()


def submit(start: Callable[[], None]) -> concurrent.futures.Future:
    """Runs ``start`` on the process's worker thread (made on first use); its future.

    Starts run one at a time, in order, and never beside one of
    :func:`exclusive`: Orbax numbers a process's saves as they start and
    keys their directory signals by that number, so two starts at once
    would take each other's.
    """
    global _executor
    with _made:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="jaxjob-save-start"
            )
    return _executor.submit(_run, start)


def _run(start: Callable[[], None]) -> None:
    with _LOCK:
        start()


def _forget_in_child() -> None:
    """A forked child has none of the parent's threads: its first small save makes its own."""
    global _executor, _LOCK, _made
    _executor, _LOCK, _made = None, threading.Lock(), threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


@contextlib.contextmanager
def exclusive() -> Iterator[None]:
    """Holds off the worker thread's starts: for a start on the training thread."""
    with _LOCK:
        yield
