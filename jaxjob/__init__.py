"""jaxjob: epoch-level, fault-tolerant training jobs on JAX with Orbax checkpoints."""

import importlib.metadata

from jaxjob import distributed as distributed
from jaxjob import hosts as hosts
from jaxjob import keep as keep
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

__version__ = importlib.metadata.version("jaxjob")
