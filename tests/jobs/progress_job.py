"""A 2-epoch job with ``progress=["loss", "accuracy"]``, logging at INFO on stderr.

Usage: ``python progress_job.py DB_PREFIX [absl]``; ``absl`` opts in to Orbax's INFO lines.
Runs alone or on every process under ``jaxjob launch``.
"""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import logging
import sys

logging.basicConfig(level=logging.INFO)  # before Orbax's import configures the root logger

import jax.numpy as jnp  # noqa: E402

import jaxjob  # noqa: E402

job_start.imported()

if "absl" in sys.argv[2:]:
    logging.getLogger("absl").setLevel(logging.INFO)
jaxjob.distributed.initialize()

job = jaxjob.Job()


@job.init_group.task
def init(ws):
    return {"x": jnp.zeros(())}


@job.epoch_group.task
def train_epoch(ws):
    return {"x": ws["x"] + 1, "loss": 1 / (ws["x"] + 1), "accuracy": ws["x"] / 4}


jaxjob.epoch_limiter(job, 2)
runner = jaxjob.JobRunner(job, jaxjob.CheckpointManager(sys.argv[1]), progress=["loss", "accuracy"])
runner.train(jaxjob.Session())
