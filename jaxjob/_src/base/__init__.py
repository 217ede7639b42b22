"""What every layer may use: errors, logs, paths, object stores, fail points, signals, leaf kinds.

Imports no other layer of jaxjob, and never Orbax or TensorStore. ``jax_private`` (JAX's
internals: the logger's process index, the coordination-service client) imports JAX only.
"""
