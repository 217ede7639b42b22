"""One writer per node and directory: the lock a checkpoint manager holds while it writes.

What the lock guarantees
------------------------

The lock of node ``n`` under ``db_prefix`` is the file
``<db_prefix>/.jaxjob/n.lock`` (:func:`lock_path`), a small JSON record
naming its holder (host, boot id, PID namespace, pid, start time) and when
the holder last renewed it. It lies in the folder :data:`LOCK_DIR` so that
nothing of jaxjob's own sits beside the checkpoint directories
``<node>.<epoch>``: a ``glob("n.*")`` finds only those. The folder is
removed with the last lock in it. A manager takes it before its first write
(``init`` or the first ``save``), keeps it while it lives and releases it on
``close()`` or when the process exits. Reading (``load``, ``restore``, the
CLI) never takes it.

* **Another live writer**: taking the lock fails with
  :class:`~jaxjob.CheckpointInUseError` naming the holder, before anything
  is written.
* **A dead holder** is taken over. Its pid decides only when the holder ran
  on this host, in this boot of its kernel and in this PID namespace (the
  record's ``boot_id`` and ``pidns`` are ours, and the ``/proc`` here is
  this namespace's): then at once when that pid is gone, belongs to another
  process since, or is a zombie (killed but not yet reaped by its parent or
  by init, which may take seconds, or never happen in a container without a
  reaping init). Otherwise — another host, another container or pod on this
  host (its pids mean nothing here, even with the same host name), a record
  of an older jaxjob without those fields — only its lease decides: it is
  taken over once not renewed for :data:`LEASE_S` seconds, never while the
  lease is fresh. A background thread renews it every :data:`LEASE_S` / 4
  seconds. Hosts' clocks must agree to well within :data:`LEASE_S`.
* **A lost lock** stops the writer: at the start of every save the holder
  reads the record again (a ``flock``-ed read locally, one GET on an object
  store); if it is gone (the record, ``.jaxjob/`` or the whole ``db_prefix``
  deleted) or names another holder, the save fails with
  :class:`~jaxjob.CheckpointInUseError` before anything is written or
  re-created. The renewal finds the same between saves and stops renewing.
* **One job, one lock**: in a ``jax.distributed`` job process 0 takes it for
  every process (a node private to one process: that process) and the
  others learn the outcome.
* **The same process** may build several managers on one node (a re-run
  notebook cell): they share the lock, which is released when the last of
  them closes. Saving from two of them at once is up to you not to do.

Every read-modify-write of the record happens under an exclusive
``flock`` of the lock file, which the kernel releases if its holder dies
(on network file systems this needs working ``flock``, as NFSv4 has). On
``gs://`` and ``s3://`` every change is conditional on the version read
(:mod:`~jaxjob._src.manager.lock.object_store`): created only if absent, replaced
(taken over, renewed) or deleted only if no one changed it since; of two
processes taking over one dead lock, one wins.

The package
-----------
One record :class:`~jaxjob._src.manager.lock.record.Record` Protocol (read,
change atomically) and its two backends, then the lock over it:

* ``pids.py``: what ``/proc`` says of a pid, this boot and PID namespace;
* ``holder.py``: :class:`Holder`, who holds a lock and whether it lives; the JSON record;
* ``record.py``: the :class:`~jaxjob._src.manager.lock.record.Record` Protocol and ``Lost``;
* ``local_file.py``: the record as a file changed under ``flock``;
* ``object_store.py``: the record as an object changed conditionally (S3, GCS);
* ``writer_lock.py``: :class:`WriterLock`, one process's hold: take, check, renew, release;
* ``shares.py``: :func:`acquire` for a job, a :class:`Handle` per manager, shared in a process.
"""

from jaxjob._src.manager.lock.holder import Holder as Holder
from jaxjob._src.manager.lock.pids import EXITED_STATES as EXITED_STATES
from jaxjob._src.manager.lock.pids import pid_start as pid_start
from jaxjob._src.manager.lock.pids import stat_fields as stat_fields
from jaxjob._src.manager.lock.shares import Handle as Handle
from jaxjob._src.manager.lock.shares import acquire as acquire
from jaxjob._src.manager.lock.writer_lock import LEASE_S as LEASE_S
from jaxjob._src.manager.lock.writer_lock import LOCK_DIR as LOCK_DIR
from jaxjob._src.manager.lock.writer_lock import WriterLock as WriterLock
from jaxjob._src.manager.lock.writer_lock import lock_path as lock_path

__all__ = [
    "EXITED_STATES",
    "LEASE_S",
    "LOCK_DIR",
    "Handle",
    "Holder",
    "WriterLock",
    "acquire",
    "lock_path",
    "pid_start",
    "stat_fields",
]
