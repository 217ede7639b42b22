"""The training loop: the runner, when it saves, its progress display, upload groups.

Imports every layer below it: ``base``, ``core``, ``internals``,
``multihost``, ``checkpoint``, ``manager``.
"""
