"""Joining a ``jax.distributed`` job: under ``jaxjob launch``, a cluster launcher, or alone.

Public as :mod:`jaxjob.distributed`, whose docstring says more.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from typing import Any

import jax

from jaxjob._src.base import jax_private
from jaxjob._src.base.checks import is_int
from jaxjob._src.base.log import get_logger
from jaxjob._src.multihost.launch import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID

__all__ = ["initialize"]

logger = get_logger(__name__)

ENV_JAX_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_JAX_PROCESS_ID = "JAX_PROCESS_ID"
ENV_RECOVERABILITY = "JAX_ENABLE_RECOVERABILITY"  # set: jaxjob leaves JAX's choice alone
EXIT_WAIT_S = 30.0  # how long process 0 keeps the service up for the others to leave
EXIT_GRACE_S = 5.0  # after the last one said it leaves: the most to wait for its disconnect
_EXIT_KEY = "jaxjob/exit"
_EXIT_SLICE_S = 0.2  # process 0 checks this often whether the others are all gone
_CLUSTER_ENV = (
    "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_SIZE",
    "TPU_WORKER_HOSTNAMES",
    "JAX_COORDINATOR_ADDRESS",
)


def _survive_dead_peers() -> None:
    """Turns on ``jax_enable_recoverability`` unless the environment chose (see the module)."""
    if ENV_RECOVERABILITY not in os.environ:
        jax.config.update("jax_enable_recoverability", True)


def initialize(*, heartbeat_timeout_s: int | None = None) -> None:
    """Joins the ``jax.distributed`` job this process belongs to; a no-op alone.

    Under ``jaxjob launch`` it reads ``JAXJOB_COORDINATOR``,
    ``JAXJOB_NUM_PROCESSES`` and ``JAXJOB_PROCESS_ID``. With
    ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``
    set (any launcher, e.g. Kubernetes) it passes them to
    ``jax.distributed.initialize``. Under a cluster's own launcher (SLURM,
    Open MPI, TPU pods, or ``JAX_COORDINATOR_ADDRESS`` alone) it lets JAX
    auto-detect. A plain single process does nothing. Call it before any
    other JAX call, on every process.

    A process that dies makes the others' next cross-host wait raise
    :class:`~jaxjob.hosts.HostTimeoutError` naming it, not abort them (see
    the module).

    Args:
        heartbeat_timeout_s: How long the coordination service hears nothing
            from a process before it counts it dead; None: JAX's default (100 s).

    Raises:
        ValueError: If ``heartbeat_timeout_s`` is not an int >= 1.

    Example:
        >>> import jaxjob
        >>> jaxjob.distributed.initialize()  # a plain process: nothing to join
        >>> jax.process_count()
        1
    """
    if heartbeat_timeout_s is not None and (
        not is_int(heartbeat_timeout_s) or heartbeat_timeout_s < 1
    ):
        raise ValueError(
            "heartbeat_timeout_s must be an int >= 1 (seconds) or None, got "
            f"{heartbeat_timeout_s!r}"
        )
    options = (
        {} if heartbeat_timeout_s is None else {"heartbeat_timeout_seconds": heartbeat_timeout_s}
    )
    if ENV_COORDINATOR in os.environ:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        _survive_dead_peers()
        jax.distributed.initialize(
            coordinator_address=os.environ[ENV_COORDINATOR],
            num_processes=int(os.environ[ENV_NUM_PROCESSES]),
            process_id=int(os.environ[ENV_PROCESS_ID]),
            **options,
        )
    elif ENV_JAX_NUM_PROCESSES in os.environ and ENV_JAX_PROCESS_ID in os.environ:
        _survive_dead_peers()
        jax.distributed.initialize(
            coordinator_address=os.environ.get("JAX_COORDINATOR_ADDRESS"),
            num_processes=int(os.environ[ENV_JAX_NUM_PROCESSES]),
            process_id=int(os.environ[ENV_JAX_PROCESS_ID]),
            **options,
        )
    elif any(name in os.environ for name in _CLUSTER_ENV):
        _survive_dead_peers()
        jax.distributed.initialize(**options)
    else:
        return
    if jax.config.jax_enable_recoverability and jax.process_count() > 1:
        atexit.register(_orderly_exit)  # after JAX's shutdown handler, so it runs before it
    logger.info("joined a jax.distributed job of %d processes", jax.process_count())


def _orderly_exit() -> None:
    """At exit: every other process says it is leaving and disconnects; process 0 waits for them.

    Process 0 hosts the coordination service, so it leaves last: it waits (at most
    :data:`EXIT_WAIT_S` in all) for each other process's key, then :data:`EXIT_GRACE_S` more
    for the disconnect that follows the key at once. It stops waiting as soon as every
    other process is gone: one killed earlier (its heartbeat expired) posts no key, and
    waiting for it would only delay the survivor's exit.
    """
    client = jax_private.distributed_client()
    me = jax.process_index()
    if me != 0:
        client.key_value_set(f"{_EXIT_KEY}/{me}", "leaving")
        jax.distributed.shutdown()
        return
    everyone = list(range(jax.process_count()))
    gone = _others_gone(client, everyone)
    deadline = time.monotonic() + EXIT_WAIT_S
    for process in everyone[1:]:
        if not _await_leaving(client, process, gone, deadline):
            logger.warning(
                "process %d had not finished %.0f s after process 0 did; exiting anyway",
                process,
                EXIT_WAIT_S,
            )
            return
    if not gone.wait(EXIT_GRACE_S):
        logger.debug("other processes still connected %.1f s after leaving", EXIT_GRACE_S)


def _await_leaving(client: Any, process: int, gone: threading.Event, deadline: float) -> bool:
    """Waits until ``process`` has posted its exit key, or every other process is gone.

    Returns:
        False if neither happened before ``deadline``.
    """
    key = f"{_EXIT_KEY}/{process}"
    while not gone.is_set():
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            return False
        try:  # in slices, to see the others go without a key (killed)
            client.blocking_key_value_get(key, int(min(left_s, _EXIT_SLICE_S) * 1000) + 1)
            return True
        except jax.errors.JaxRuntimeError as err:
            if not jax_private.timed_out(err):  # the service is gone: nothing to wait for
                logger.debug("waiting for process %d to leave failed: %r", process, err)
                return True
    return True


def _others_gone(client: Any, processes: list[int]) -> threading.Event:
    """An event set once only this process is connected to the service (or it went down).

    The service answers ``get_live_nodes`` once every connected process in the
    list has asked it or has disconnected: the others never ask, so it answers
    when they are gone, having left or been found dead (in ~1 ms once they are;
    a fixed pause cost every multi-process job 1 s at exit). It has no timeout
    of its own, so it is asked from a daemon thread.
    """
    answered = threading.Event()

    def ask() -> None:
        try:
            client.get_live_nodes(processes)
        except Exception as err:  # the service went down: nothing left to wait for
            logger.debug("waiting for the others to disconnect failed: %r", err)
        answered.set()

    threading.Thread(target=ask, name="jaxjob-exit", daemon=True).start()
    return answered
