"""The training loop: the runner, resuming, epoch ends, save policy and failures, progress, upload.

Imports every layer below it: ``base``, ``core``, ``internals``,
``multihost``, ``checkpoint``, ``manager``.
"""
