"""One checkpoint directory: its layout, leaf codec, manifest, checksums, storage and reads.

Imports ``base``, ``internals`` and, for the type ``restore`` returns,
``core.workspace``. Orbax is reached through one handle, ``io.CheckpointIO``:
only ``io`` imports ``internals.orbax_*`` (and ``storage`` and ``listing``
``internals.orbax_files``, the readers of Orbax's files).

What a leaf is: ``leaf_spec``; a tree's structure: ``tree``; how a leaf is
stored: the codecs of ``codec``, above both and ``hostlocal`` (no module of
the package imports itself back). ``FORMAT.md`` beside this file names every
file a save writes and the module that writes and reads it.
"""
