"""The manifest handler under the name every checkpoint's ``_CHECKPOINT_METADATA`` records.

Orbax writes each item handler's class path into the checkpoint; checkpoints
say ``jaxjob.orbax_adapter.ManifestHandler``, so that name stays importable.
The handler lives in :mod:`jaxjob._src.internals.orbax_private`.
"""

from jaxjob._src.internals.orbax_private import ManifestHandler as ManifestHandler

__all__ = ["ManifestHandler"]
