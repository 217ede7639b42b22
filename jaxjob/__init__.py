"""jaxjob: epoch-level, fault-tolerant training jobs on JAX with Orbax checkpoints.

The public names below are imported on first use, so that the ``jaxjob``
command (``jaxjob --help``, ``jaxjob ls``) starts without importing JAX or
Orbax. Each public name has one import path: ``jaxjob.<name>``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import types
from typing import TYPE_CHECKING, Any

_SUBMODULES = ("distributed", "hosts", "keep", "testing")  # public modules
_EXPORTS = {  # public name -> the module defining it
    "CheckpointManager": "jaxjob.checkpoint",
    "CheckpointInUseError": "jaxjob.errors",
    "CheckpointSaveError": "jaxjob.errors",
    "CorruptCheckpointError": "jaxjob.errors",
    "Preempted": "jaxjob.errors",
    "HostTimeoutError": "jaxjob.hosts",
    "Job": "jaxjob.job",
    "epoch_limiter": "jaxjob.job",
    "db_name": "jaxjob.layout",
    "get_ckpt_filename": "jaxjob.layout",
    "CheckpointOptions": "jaxjob.manager",
    "DiskMetadataHandler": "jaxjob.metadata",
    "MetadataHandler": "jaxjob.metadata",
    "MultiNodeCheckpointManager": "jaxjob.multinode",
    "restore": "jaxjob.restore",
    "JobRunner": "jaxjob.runner",
    "Session": "jaxjob.session",
    "Node": "jaxjob.task",
    "Task": "jaxjob.task",
    "TaskGroup": "jaxjob.task",
    "UploadTaskGroupBuilder": "jaxjob.upload",
    "Workspace": "jaxjob.workspace",
}

__all__ = sorted([*_SUBMODULES, *_EXPORTS])
__version__ = importlib.metadata.version("jaxjob")

if TYPE_CHECKING:  # what type checkers and IDEs see; the same names as _EXPORTS
    from jaxjob import distributed as distributed
    from jaxjob import hosts as hosts
    from jaxjob import keep as keep
    from jaxjob import testing as testing
    from jaxjob.checkpoint import CheckpointManager as CheckpointManager
    from jaxjob.errors import CheckpointInUseError as CheckpointInUseError
    from jaxjob.errors import CheckpointSaveError as CheckpointSaveError
    from jaxjob.errors import CorruptCheckpointError as CorruptCheckpointError
    from jaxjob.errors import Preempted as Preempted
    from jaxjob.hosts import HostTimeoutError as HostTimeoutError
    from jaxjob.job import Job as Job
    from jaxjob.job import epoch_limiter as epoch_limiter
    from jaxjob.layout import db_name as db_name
    from jaxjob.layout import get_ckpt_filename as get_ckpt_filename
    from jaxjob.manager import CheckpointOptions as CheckpointOptions
    from jaxjob.metadata import DiskMetadataHandler as DiskMetadataHandler
    from jaxjob.metadata import MetadataHandler as MetadataHandler
    from jaxjob.multinode import MultiNodeCheckpointManager as MultiNodeCheckpointManager
    from jaxjob.restore import restore as restore
    from jaxjob.runner import JobRunner as JobRunner
    from jaxjob.session import Session as Session
    from jaxjob.task import Node as Node
    from jaxjob.task import Task as Task
    from jaxjob.task import TaskGroup as TaskGroup
    from jaxjob.upload import UploadTaskGroupBuilder as UploadTaskGroupBuilder
    from jaxjob.workspace import Workspace as Workspace


def _resolve(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


class _Package(types.ModuleType):
    """The package module: public names load on first access.

    Importing a submodule sets it as an attribute of the package; a public
    name that is also a submodule's name (``restore``) keeps the public object.
    """

    def __getattr__(self, name: str) -> Any:
        if name not in __all__:
            raise AttributeError(f"module 'jaxjob' has no attribute {name!r}")
        value = _resolve(name)
        self.__dict__[name] = value
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and name in _EXPORTS:
            value = getattr(value, name)  # the submodule jaxjob.restore: keep jaxjob.restore()
        super().__setattr__(name, value)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(__all__))


sys.modules[__name__].__class__ = _Package
