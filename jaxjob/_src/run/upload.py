"""The upload hook: a task group built after training, once every save is committed."""

from __future__ import annotations

from typing import Any

from jaxjob._src.core.task import TaskGroup

__all__ = ["UploadTaskGroupBuilder"]


class UploadTaskGroupBuilder:
    """Builds the task group that uploads the last epoch's checkpoints.

    Subclass it and override :meth:`build`. The runner calls it after the
    last epoch, once every pending save is committed, and runs the group.

    Example:
        >>> import shutil, jaxjob
        >>> class CopyOut(jaxjob.UploadTaskGroupBuilder):
        ...     def __init__(self, dest):
        ...         self.dest = dest
        ...
        ...     def build(self, epoch, checkpoint_manager):
        ...         group = jaxjob.TaskGroup(jit=False)
        ...         for node, manager in checkpoint_manager.node_managers:
        ...             src, dest = manager.get_ckpt_db_name(node, epoch), f"{self.dest}/{node}"
        ...
        ...             def copy(ws, src=src, dest=dest):  # a host task; it sets no leaf
        ...                 shutil.copytree(src, dest)
        ...
        ...             group.add(copy, name=f"upload {node}")
        ...         return group
    """

    __module__ = "jaxjob"  # its public path, in reprs, help() and pickles

    def build(self, epoch: int, checkpoint_manager: Any) -> TaskGroup:
        """Returns the group that uploads the checkpoints of ``epoch``.

        Raises:
            NotImplementedError: In this base class.
        """
        raise NotImplementedError("subclass UploadTaskGroupBuilder and implement build()")
