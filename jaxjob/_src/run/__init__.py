"""The training loop: runner, resume, epoch ends, saves and failures, progress, history, upload.

Imports every layer below it: ``base``, ``core``, ``internals``,
``multihost``, ``checkpoint``, ``manager``.
"""
