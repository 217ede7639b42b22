"""A series of epochs' checkpoints: the two managers, metadata, retention, locks, boundaries.

Imports ``base``, ``core``, ``multihost``, ``internals`` and ``checkpoint``.
"""
