"""The training loop: runner, resume, epoch ends, saves and failures, progress, history, upload.

Imports ``base``, ``core``, ``multihost``, ``checkpoint`` and ``manager``; Orbax only
through ``checkpoint.io`` (never ``orbax`` nor ``internals``).
"""
