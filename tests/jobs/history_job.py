"""A small regression job with ``progress=["loss"]``, a JSONL and a TensorBoard writer.

Usage: ``python history_job.py DB_PREFIX METRICS_DIR [EPOCHS]`` (default 6 epochs): checkpoints
under DB_PREFIX, ``METRICS_DIR/metrics.jsonl`` and ``METRICS_DIR/tb``; at the end it prints
``HISTORY <runner.history as JSON>``. Runs alone or on every process under ``jaxjob launch``.
``build(epochs)`` gives the job to a test that runs it in its own process.
"""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxjob

job_start.imported()

X = np.cos(np.arange(32 * 4, dtype=np.float32)).reshape(32, 4)
Y = X @ np.array([1.0, -2.0, 0.5, 3.0], dtype=np.float32)


def build(epochs: int) -> jaxjob.Job:
    """Gradient descent on a linear model; the epoch's output ``loss`` is its mean squared error."""
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"w": jnp.zeros(4)}, name="init")

    @job.epoch_group.task
    def train(ws):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((X @ w - Y) ** 2))(ws["w"])
        return {"w": ws["w"] - 0.05 * grad, "loss": loss}

    jaxjob.epoch_limiter(job, epochs)
    return job


def writers(metrics_dir: str) -> list[jaxjob.MetricWriter]:
    return [
        jaxjob.JsonlWriter(os.path.join(metrics_dir, "metrics.jsonl")),
        jaxjob.TensorBoardWriter(os.path.join(metrics_dir, "tb")),
    ]


def main() -> None:
    jaxjob.distributed.initialize()
    db_prefix, metrics_dir = sys.argv[1], sys.argv[2]
    epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    ckpt = jaxjob.CheckpointManager(db_prefix)
    runner = jaxjob.JobRunner(build(epochs), ckpt, progress=["loss"], writers=writers(metrics_dir))
    runner.train(jaxjob.Session())
    print("HISTORY", json.dumps(runner.history), flush=True)


if __name__ == "__main__":
    main()
