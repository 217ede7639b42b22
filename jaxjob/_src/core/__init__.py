"""The pure job model: workspace, tasks and groups, jobs, sessions and their checks.

Imports JAX, NumPy and ``base`` only: nothing that reads or writes a checkpoint.
"""
