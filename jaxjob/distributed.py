"""Joining a ``jax.distributed`` job: under ``jaxjob launch``, a cluster launcher, or alone."""

from __future__ import annotations

import os

import jax

from jaxjob.log import get_logger

__all__ = ["initialize"]

logger = get_logger(__name__)

ENV_COORDINATOR = "JAXJOB_COORDINATOR"
ENV_NUM_PROCESSES = "JAXJOB_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXJOB_PROCESS_ID"
ENV_JAX_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_JAX_PROCESS_ID = "JAX_PROCESS_ID"
_CLUSTER_ENV = (
    "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_SIZE",
    "TPU_WORKER_HOSTNAMES",
    "JAX_COORDINATOR_ADDRESS",
)


def initialize() -> None:
    """Joins the ``jax.distributed`` job this process belongs to; a no-op alone.

    Under ``jaxjob launch`` it reads ``JAXJOB_COORDINATOR``,
    ``JAXJOB_NUM_PROCESSES`` and ``JAXJOB_PROCESS_ID``. With
    ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``
    set (any launcher, e.g. Kubernetes) it passes them to
    ``jax.distributed.initialize``. Under a cluster's own launcher (SLURM,
    Open MPI, TPU pods, or ``JAX_COORDINATOR_ADDRESS`` alone) it lets JAX
    auto-detect. A plain single process does nothing. Call it before any
    other JAX call, on every process.

    Example:
        >>> import jaxjob
        >>> jaxjob.distributed.initialize()  # a plain process: nothing to join
        >>> jax.process_count()
        1
    """
    if ENV_COORDINATOR in os.environ:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=os.environ[ENV_COORDINATOR],
            num_processes=int(os.environ[ENV_NUM_PROCESSES]),
            process_id=int(os.environ[ENV_PROCESS_ID]),
        )
    elif ENV_JAX_NUM_PROCESSES in os.environ and ENV_JAX_PROCESS_ID in os.environ:
        jax.distributed.initialize(
            coordinator_address=os.environ.get("JAX_COORDINATOR_ADDRESS"),
            num_processes=int(os.environ[ENV_JAX_NUM_PROCESSES]),
            process_id=int(os.environ[ENV_JAX_PROCESS_ID]),
        )
    elif any(name in os.environ for name in _CLUSTER_ENV):
        jax.distributed.initialize()
    else:
        return
    logger.info("joined a jax.distributed job of %d processes", jax.process_count())
