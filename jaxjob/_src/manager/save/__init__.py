"""The save protocol of one epoch: prepare -> exchange -> conclude -> start -> finish.

A save round (:func:`save_round.save_round`)
--------------------------------------------

Every process of a ``jax.distributed`` job makes the same calls. For one epoch:

1. **prepare** (each writer this process saves, waiting on no other process):
   finish this process's save in flight (its failure becomes the post's
   ``previous``), take the node's lock (at the first save; later ones read its
   record again: a lost lock is this save's problem), build the manifest,
   encode the leaves, check that one more copy of them fits in host memory
   (``base/memory.py``), move a committed checkpoint of the epoch aside
   (``supersede.py``). A problem
   (unwritable prefix, refused access, a leaf that cannot be stored, no room)
   is not raised: it goes into this process's ``records.SavePost``.
2. **one exchange**: ``hosts.exchange`` of every writer's post: a single-node
   manager posts its post, a multi-node manager ``{node: post}``.
3. **conclude** (``boundary.conclude``, per writer, from every process's post
   of that node): the previous save's failure on any process, this save's
   problem on any process, host-local leaves or replicated arrays that differ.
   A node private to another process (``owner_process``) is concluded from its
   owner's post alone.
4. **start** all writers, or none if any node's save cannot start anywhere.
   Orbax writes in the background; each process's shard checksums go into
   its ``jaxjob/checksums.<p>.json``, and the commit (``internals/orbax_commit.py``:
   ``DurableRename`` locally, ``TabledCommitFile`` on object stores) writes the
   file table ``jaxjob/files.json`` just before the commit marker
   (``base/file_table.py``; what it covers: the README's Integrity section).

Then the tier writes the deferred metadata record (only once its save
committed everywhere), applies retention on ``supersede.deleting_process`` (the
nodes' one owner, else process 0: the same rule tells a writer whether it
cleans up after its own saves) and raises this save's problem, else the previous
save's failure. ``end_round`` (behind ``wait_until_finished``) is the same with
nothing to start: finish, one exchange, conclude.

Modules, in the order of a save
-------------------------------

* ``save_round``: the round over a tier's writers (one exchange per epoch).
* ``writer``: :class:`writer.NodeWriter`, one node's saves (prepare, start, finish).
* ``save_plan``: what prepare builds (manifest, encoded leaves, the post).
* ``supersede``: a committed checkpoint of the same epoch moved aside, put back on failure.
* ``boundary``: conclude a round from every process's post.
* ``background_start``: the worker thread that starts Orbax's write off the training thread.
"""
