"""Every Orbax checkpointer jaxjob uses is made here, with jaxjob's replacements in place.

:func:`checkpointer` makes them (through
:class:`jaxjob._src.checkpoint.io.CheckpointIO`, jaxjob's one I/O handle) and
first calls :func:`install`, which puts jaxjob's replacements of Orbax's module
functions in place (:mod:`~jaxjob._src.internals.orbax_kvstore`,
:mod:`~jaxjob._src.internals.orbax_reads`): importing a module of this
package replaces nothing. A save is committed as
:mod:`~jaxjob._src.internals.orbax_commit` says; a private checkpoint (one
process alone) is made with :func:`private_options`.

This module uses Orbax's public API only (``ocp.Checkpointer``,
``ocp.AsyncCheckpointer``, ``ocp.AsyncOptions``, ``ocp.options``).
"""

from __future__ import annotations

import jax
import orbax.checkpoint as ocp

from jaxjob._src.base.log import get_logger
from jaxjob._src.internals import (
    commit_barrier,
    orbax_commit,
    orbax_kvstore,
    orbax_reads,
    orbax_version,
)

__all__ = [
    "checkpointer",
    "directory_options",
    "drain_failed_save",
    "install",
    "private_options",
]

logger = get_logger(__name__)

orbax_version.check()


def install() -> None:
    """Puts jaxjob's replacements of three Orbax functions in place; later calls change nothing.

    ``tensorstore_utils.build_kvstore_tspec`` (``s3://``; no per-file fsync
    under a DurableRename; memmap reads on a RAM disk),
    ``serialization._read_shard`` (64-byte aligned restore buffers) and
    ``asyncio_utils._run_sync_via_new_loop`` (no read left in flight on a
    closed event loop). Orbax looks all three up on their modules at call time.
    """
    orbax_kvstore.install()
    orbax_reads.install()


def directory_options() -> ocp.AsyncOptions:
    """A composite handler's ``async_options``: its item directories made before its save returns.

    Orbax can make a save's directories in a thread of its own
    (``create_directories_asynchronously``), but that thread belongs to no
    commit until the save has started: when the save then fails as it starts
    (a fail point, a full disk), nothing waits for the thread, and it may make
    the temporary directory again after jaxjob removed it (a full tmpfs once
    left ``local.7.orbax-checkpoint-tmp`` so, under load). In a multi-process
    job the asynchronous mode is not safe at all: Orbax keys its signals in the
    job-wide key-value store by a per-process count of saves, which differs
    between processes as soon as one saves what another does not. So every
    checkpointer and composite handler makes them before its save returns (a
    few milliseconds, not measurable in the blocked time: ``benchmarks/README.md``).
    """
    return ocp.AsyncOptions(create_directories_asynchronously=False)


def private_options() -> ocp.options.MultiprocessingOptions:
    """Orbax options making this process the only one that takes part."""
    me = jax.process_index()
    return ocp.options.MultiprocessingOptions(
        primary_host=me, active_processes={me}, barrier_sync_key_prefix=f"jaxjob_private_{me}"
    )


def checkpointer(
    path: str,
    handler: ocp.CompositeCheckpointHandler,
    *,
    private: bool,
    async_timeout_s: float | None = None,
) -> ocp.Checkpointer:
    """An Orbax checkpointer for checkpoints under ``path`` (a db_prefix or a checkpoint).

    Args:
        path: Where the checkpoints are (chooses how a save is committed).
        handler: The composite handler of a checkpoint directory.
        private: This process alone takes part (in a multi-process job).
        async_timeout_s: Make an ``AsyncCheckpointer`` whose background
            write may take this long; None: a synchronous one. A shared one of
            a multi-process job waits at jaxjob's barriers
            (:mod:`~jaxjob._src.internals.commit_barrier`), which end as soon as
            a process's write fails.
    """
    install()
    kwargs = orbax_commit.commit_options(path)
    alone = private and jax.process_count() > 1
    if alone:
        kwargs["multiprocessing_options"] = private_options()
    if async_timeout_s is None:
        return ocp.Checkpointer(handler, **kwargs)
    shared = not private and jax.process_count() > 1  # its barriers end on a failed write
    options = ocp.AsyncOptions(
        timeout_secs=max(1, round(async_timeout_s)),
        create_directories_asynchronously=False,  # see directory_options
        barrier_sync_fn=commit_barrier.wait if shared else None,
    )
    return ocp.AsyncCheckpointer(handler, async_options=options, **kwargs)


def drain_failed_save(saver: ocp.AsyncCheckpointer) -> None:
    """Waits for what Orbax still runs in the background for a save that failed as it started.

    Orbax's checkpoint metadata store writes a save's ``_CHECKPOINT_METADATA``
    in a thread of its own as it makes the save's directory; when the save then
    fails as it starts, that write is not part of any commit, and it may fail on
    the directory jaxjob removes. Orbax keeps that error and raises it at the
    next save, as the next epoch's failure. So the failed save and the next one
    each wait first. The error belongs to the failed save, whose failure is
    recorded already: it is logged at DEBUG.
    """
    try:
        saver.wait_until_finished()
    except Exception as err:  # the failed save's own background work: already reported
        logger.debug("the background work of a failed save failed too: %s", err)
