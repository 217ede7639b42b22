"""A series of epochs' checkpoints: one node save engine, two managers over it, locks, retention.

Imports ``base``, ``core``, ``multihost`` and ``checkpoint``; Orbax only through
``checkpoint.io`` (never ``orbax`` nor ``internals``).
"""
