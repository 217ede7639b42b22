"""Working across processes: cross-host waits, ``jax.distributed`` set-up, ``jaxjob launch``.

Imports ``base`` only (``base.jax_private`` for JAX's internals); never Orbax. ``launch``
imports the standard library only (``jaxjob launch`` starts without JAX).
"""
