"""What every layer may use: errors, loggers, paths and files, fail points, signals, leaf kinds.

Imports no other layer of jaxjob except ``internals.jax_private`` (the logger's
process index), and never Orbax or TensorStore.
"""
