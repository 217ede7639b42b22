"""Every use of Orbax's private APIs, one module per mechanism, each saying why it is needed.

``orbax_commit`` (how a save is committed), ``orbax_kvstore`` (TensorStore's
specs), ``orbax_reads`` (restore buffers, event loops), ``orbax_handlers``
(item handlers) and ``orbax_checkpointer`` (the checkpointers, built by
``checkpoint.io`` alone) import Orbax, TensorStore and ``base``;
``orbax_version`` checks the installed release; ``orbax_files`` reads Orbax's
files. ``tests/internals/test_orbax_contract.py`` checks every private name
they use. JAX's internals are in ``base.jax_private``.
"""
