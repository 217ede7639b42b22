"""jaxjob: epoch-level, fault-tolerant training jobs on JAX with Orbax checkpoints.

The public names below are imported on first use, so that the ``jaxjob``
command (``jaxjob --help``, ``jaxjob ls``) starts without importing JAX or
Orbax. Each public name has one import path: ``jaxjob.<name>``; the public
classes say so themselves (``jaxjob.Preempted`` in a traceback). The
implementation lives in a private subpackage, one folder per layer.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

_SUBMODULES = ("data", "distributed", "hosts", "keep", "testing")  # public modules
_EXPORTS = {  # public name -> the module defining it
    "CheckpointManager": "jaxjob._src.manager.checkpoint_manager",
    "CheckpointInUseError": "jaxjob._src.base.errors",
    "CheckpointSaveError": "jaxjob._src.base.errors",
    "CorruptCheckpointError": "jaxjob._src.base.errors",
    "Preempted": "jaxjob._src.base.errors",
    "HostTimeoutError": "jaxjob._src.multihost.hosts",
    "LineageError": "jaxjob._src.checkpoint.run_identity",
    "MissingExtraError": "jaxjob._src.base.remote",
    "ProcessCountError": "jaxjob._src.checkpoint.hostlocal",
    "StorageError": "jaxjob._src.base.remote",
    "StorageTimeoutError": "jaxjob._src.base.remote",
    "UnstorableLeafError": "jaxjob._src.checkpoint.leaf_spec",
    "Job": "jaxjob._src.core.job",
    "epoch_limiter": "jaxjob._src.core.job",
    "db_name": "jaxjob._src.checkpoint.layout",
    "get_ckpt_filename": "jaxjob._src.checkpoint.layout",
    "CheckpointOptions": "jaxjob._src.manager.shared",
    "LocalTier": "jaxjob._src.manager.local_tier",
    "DiskMetadataHandler": "jaxjob._src.manager.metadata",
    "MetadataHandler": "jaxjob._src.manager.metadata",
    "MultiNodeCheckpointManager": "jaxjob._src.manager.multinode",
    "restore": "jaxjob._src.checkpoint.restore",
    "JobRunner": "jaxjob._src.run.runner",
    "JsonlWriter": "jaxjob._src.run.writers",
    "MetricWriter": "jaxjob._src.run.writers",
    "TensorBoardWriter": "jaxjob._src.run.tensorboard",
    "AutoInterval": "jaxjob._src.run.auto_interval",
    "Session": "jaxjob._src.core.session",
    "Node": "jaxjob._src.core.task",
    "Task": "jaxjob._src.core.task",
    "TaskGroup": "jaxjob._src.core.task",
    "UploadTaskGroupBuilder": "jaxjob._src.run.upload",
    "Workspace": "jaxjob._src.core.workspace",
}

__all__ = sorted([*_SUBMODULES, *_EXPORTS])

if TYPE_CHECKING:  # what type checkers and IDEs see; the same names as _EXPORTS
    from jaxjob import data as data
    from jaxjob import distributed as distributed
    from jaxjob import hosts as hosts
    from jaxjob import keep as keep
    from jaxjob import testing as testing
    from jaxjob._src.base.errors import CheckpointInUseError as CheckpointInUseError
    from jaxjob._src.base.errors import CheckpointSaveError as CheckpointSaveError
    from jaxjob._src.base.errors import CorruptCheckpointError as CorruptCheckpointError
    from jaxjob._src.base.errors import Preempted as Preempted
    from jaxjob._src.base.remote import MissingExtraError as MissingExtraError
    from jaxjob._src.base.remote import StorageError as StorageError
    from jaxjob._src.base.remote import StorageTimeoutError as StorageTimeoutError
    from jaxjob._src.checkpoint.hostlocal import ProcessCountError as ProcessCountError
    from jaxjob._src.checkpoint.layout import db_name as db_name
    from jaxjob._src.checkpoint.layout import get_ckpt_filename as get_ckpt_filename
    from jaxjob._src.checkpoint.leaf_spec import UnstorableLeafError as UnstorableLeafError
    from jaxjob._src.checkpoint.restore import restore as restore
    from jaxjob._src.checkpoint.run_identity import LineageError as LineageError
    from jaxjob._src.core.job import Job as Job
    from jaxjob._src.core.job import epoch_limiter as epoch_limiter
    from jaxjob._src.core.session import Session as Session
    from jaxjob._src.core.task import Node as Node
    from jaxjob._src.core.task import Task as Task
    from jaxjob._src.core.task import TaskGroup as TaskGroup
    from jaxjob._src.core.workspace import Workspace as Workspace
    from jaxjob._src.manager.checkpoint_manager import CheckpointManager as CheckpointManager
    from jaxjob._src.manager.local_tier import LocalTier as LocalTier
    from jaxjob._src.manager.metadata import DiskMetadataHandler as DiskMetadataHandler
    from jaxjob._src.manager.metadata import MetadataHandler as MetadataHandler
    from jaxjob._src.manager.multinode import (
        MultiNodeCheckpointManager as MultiNodeCheckpointManager,
    )
    from jaxjob._src.manager.shared import CheckpointOptions as CheckpointOptions
    from jaxjob._src.multihost.hosts import HostTimeoutError as HostTimeoutError
    from jaxjob._src.run.auto_interval import AutoInterval as AutoInterval
    from jaxjob._src.run.runner import JobRunner as JobRunner
    from jaxjob._src.run.tensorboard import TensorBoardWriter as TensorBoardWriter
    from jaxjob._src.run.upload import UploadTaskGroupBuilder as UploadTaskGroupBuilder
    from jaxjob._src.run.writers import JsonlWriter as JsonlWriter
    from jaxjob._src.run.writers import MetricWriter as MetricWriter


def _resolve(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


class _Package(types.ModuleType):
    """The package module: public names load on first access."""

    def __getattr__(self, name: str) -> Any:
        if name == "__version__":  # read on first use: importing jaxjob reads no package metadata
            import importlib.metadata

            self.__dict__[name] = importlib.metadata.version("jaxjob")
            return self.__dict__[name]
        if name not in __all__:
            raise AttributeError(f"module 'jaxjob' has no attribute {name!r}")
        value = _resolve(name)
        self.__dict__[name] = value
        return value

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(__all__))


sys.modules[__name__].__class__ = _Package
