"""A series of epochs' checkpoints: one node save engine, two managers over it, locks, retention.

Imports ``base``, ``core``, ``multihost``, ``internals`` and ``checkpoint``.
"""
