"""What every layer may use: errors, logs, paths, object stores, fail points, signals, leaf kinds.

Imports no other layer of jaxjob except ``internals.jax_private`` (the logger's
process index), and never Orbax or TensorStore.
"""
