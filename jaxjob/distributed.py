"""Joining a ``jax.distributed`` job: under ``jaxjob launch``, a cluster launcher, or alone.

**A dead process.** By default JAX's coordination service, once a process
has sent no heartbeat for ``heartbeat_timeout_seconds`` (100 s), tells every
other process, whose C++ runtime then aborts with a stack trace, wherever
it is. :func:`initialize` turns on ``jax_enable_recoverability`` instead: the
service does not spread one process's death, and the survivors learn of it
at their next cross-host wait, which raises
:class:`~jaxjob.hosts.HostTimeoutError` naming the dead process within
jaxjob's own timeout (the ``timeout_s`` of the runner and the manager). At
exit the shutdown barrier then does not wait for the dead process either.
Set ``JAX_ENABLE_RECOVERABILITY=0`` to keep JAX's abort (a survivor stuck in
a device collective with a dead peer, which no jaxjob wait can see, is then
ended by the heartbeat abort instead of hanging). The death of process 0,
which hosts the service, still makes the others abort at once: JAX 0.10's
client calls ``LOG(FATAL)`` when it loses the service, and the callback that
would replace it cannot be set from Python (it fails with
``std::bad_cast``).

**An orderly exit.** With recoverability on, JAX's shutdown is no barrier:
process 0, which hosts the service, may exit while another process is still
disconnecting, and that process then aborts ("Failed to disconnect from
coordination service"). :func:`initialize` therefore registers an exit
handler that runs before JAX's own: every other process posts a key and
disconnects at once, and process 0 keeps the service up until every other
process has posted (at most :data:`EXIT_WAIT_S` seconds in all: a dead
process never posts) and then disconnected (at most :data:`EXIT_GRACE_S`
more; it leaves as soon as they have, not after a fixed pause).
"""

from jaxjob._src.multihost.distributed import initialize as initialize

__all__ = ["initialize"]
