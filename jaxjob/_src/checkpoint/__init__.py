"""One checkpoint directory: its layout, leaf codec, manifest, checksums, storage and reads.

Imports ``base``, ``internals`` and, for the type ``restore`` returns,
``core.workspace``. Only the modules doing Orbax I/O import
``internals.orbax_private``.
"""
