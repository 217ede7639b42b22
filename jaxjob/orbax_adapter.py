"""The manifest handler under the name every checkpoint's ``_CHECKPOINT_METADATA`` records.

Orbax writes each item handler's class path into the checkpoint; checkpoints
say ``jaxjob.orbax_adapter.ManifestHandler``, so that name stays importable.
The handler itself lives with jaxjob's other uses of Orbax's internals.
"""

from jaxjob._src.internals.orbax_handlers import ManifestHandler as ManifestHandler

__all__ = ["ManifestHandler"]
