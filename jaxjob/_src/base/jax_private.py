"""Every use of JAX's internals, in one place, each with why no public API serves.

It imports JAX only, never Orbax or TensorStore: the logger (every line
names its process) and the cross-host waits use it, and importing jaxjob or
running ``jaxjob launch`` must not import Orbax.

* **The coordination-service client** of ``jax.distributed``, for jaxjob's
  cross-process waits (:mod:`jaxjob._src.multihost.hosts`): JAX has no public
  accessor (Orbax reads it the same way).
* **Whether a wait of that client timed out** (:func:`timed_out`): its errors are
  ``JaxRuntimeError`` s whose status shows only in their text.
* **This process's index before a backend exists**, for the ``[process=i]``
  prefix of every log line: ``jax.process_index()`` initializes a backend,
  ``jax._src.distributed.global_state`` does not.
* **Whether a sharding fits a shape** (:func:`check_sharding`): JAX 0.8.2 and
  later check it in ``jax.ShapeDtypeStruct(..., sharding=)``; 0.8.0 and 0.8.1
  do not, so jaxjob calls the same (undocumented) check itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

__all__ = ["check_sharding", "distributed_client", "distributed_process_id", "timed_out"]


def distributed_client() -> Any:
    """The coordination-service client that ``jax.distributed.initialize()`` made.

    Raises:
        RuntimeError: If ``jax.distributed`` is not initialized.
    """
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError(
            f"jax.process_count() is {jax.process_count()} but jax.distributed is not "
            "initialized; call jaxjob.distributed.initialize() first"
        )
    return client


def distributed_process_id() -> int | None:
    """This process's index in a ``jax.distributed`` job, or None outside one.

    Reads JAX's distributed state without initializing a backend, so it is
    safe to call before ``jax.distributed.initialize()``.
    """
    from jax._src import distributed

    state = distributed.global_state
    return None if state.client is None else state.process_id


def timed_out(err: BaseException) -> bool:
    """Whether ``err``, raised by a wait of :func:`distributed_client`, is its timeout.

    The client raises ``jax.errors.JaxRuntimeError`` for every failure; the
    status (``DEADLINE_EXCEEDED``) is only in the message.

    Example:
        >>> timed_out(RuntimeError("DEADLINE_EXCEEDED: Barrier timed out")), timed_out(OSError())
        (True, False)
    """
    return "DEADLINE_EXCEEDED" in str(err)


def check_sharding(sharding: jax.sharding.Sharding, shape: Sequence[int]) -> None:
    """Raises as ``jax.ShapeDtypeStruct`` does (JAX 0.8.2+) if ``sharding`` cannot shard ``shape``.

    JAX 0.8.0 and 0.8.1 make the struct unchecked, and a spec of a higher rank
    than the array then fails inside Orbax's restore as an ``IndexError``. A
    sharding class without the check (``SingleDeviceSharding`` in 0.8.0 and
    0.8.1) fits every shape.

    Raises:
        ValueError: If the spec names more dimensions than ``shape`` has, or
            a dimension does not divide by its mesh axes (JAX's message).
    """
    check = getattr(type(sharding), "check_compatible_aval", None)
    if check is not None:
        check(sharding, tuple(shape))
