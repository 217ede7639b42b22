"""jaxjob's implementation, one folder per layer; the public names are re-exported by ``jaxjob``.

From the bottom up, each layer importing only those below it
(``tests/test_layers.py`` checks it):

* ``base``: errors, logging, paths and files, fail points, signals, JAX's
  internals (``jax_private``, which imports nothing of jaxjob).
* ``internals``: every use of Orbax's private APIs, one module per mechanism
  (they import ``base``), reached from above through ``checkpoint.io``.
* ``core``: the pure job model: workspace, tasks, jobs, sessions.
* ``multihost``: waits between processes, ``jax.distributed``, ``jaxjob launch``.
* ``checkpoint``: one checkpoint directory.
* ``manager``: a series of epochs' checkpoints: the managers, retention, locks.
* ``run``: the runner's loop.
* ``cli`` and ``testing``: the ``jaxjob`` command and the fault-injection kit.

Nothing here is public: import from ``jaxjob`` (or ``jaxjob.keep``,
``jaxjob.hosts``, ``jaxjob.distributed``, ``jaxjob.testing``, ``jaxjob.cli``).
"""
