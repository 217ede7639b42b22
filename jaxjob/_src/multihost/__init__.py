"""Working across processes: cross-host waits, ``jax.distributed`` set-up, ``jaxjob launch``.

Imports ``base`` and ``internals.jax_private``; never Orbax. ``launch``
imports the standard library only (``jaxjob launch`` starts without JAX).
"""
