"""Every use of JAX's and Orbax's private APIs, each with why no public API serves.

``jax_private`` imports JAX only (no Orbax, no jaxjob module);
``orbax_private`` imports Orbax, TensorStore, ``base`` and ``restore_buffers``
(NumPy and TensorStore only); ``orbax_files`` reads Orbax's files through it.
"""
