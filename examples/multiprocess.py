"""A data-parallel job on several processes: each reads its own rows, all share one checkpoint.

Every process runs this same script (SPMD). ``jaxjob.distributed.initialize()`` joins them into
one ``jax.distributed`` job; the model is replicated and each global batch is split over every
device of every process along the mesh axis ``batch``: ``Job.add_data`` with an
``IndexCursor`` gives each process only its own rows of each batch (the cursor, one value for
the whole job, is saved with the checkpoint), assembled into one global array. All processes
write their parts of one checkpoint in --ckpt-dir, which each of them must see (a shared file
system or a bucket). Kill any process, or all: the launcher stops the rest, and the same
command resumes from the newest epoch committed by every process.

On this machine, two processes:

    jaxjob launch -n 2 -- python examples/multiprocess.py --epochs 10 --ckpt-dir runs/mp

SLURM: one process per host; JAX finds the coordinator, the process count and each process's
id from SLURM's variables. A batch script for 4 hosts with 8 GPUs each (``--requeue``: a
preempted job starts again and resumes; ``--signal``: SIGTERM 2 minutes before the time limit,
which saves the running epoch):

    #!/bin/bash
    #SBATCH --nodes=4
    #SBATCH --ntasks-per-node=1
    #SBATCH --gpus-per-node=8
    #SBATCH --time=04:00:00
    #SBATCH --requeue
    #SBATCH --signal=TERM@120
    srun python examples/multiprocess.py --epochs 100 --ckpt-dir /shared/runs/mp

Kubernetes: an indexed Job, one pod per host, with a headless Service named ``mp`` (selector
``job-name: mp``) so that pod 0 is reachable as ``mp-0.mp``; each pod sets JAX's three
variables, its process id from its completion index:

    apiVersion: batch/v1
    kind: Job
    metadata:
      name: mp
    spec:
      completionMode: Indexed
      completions: 4
      parallelism: 4
      backoffLimitPerIndex: 0
      podFailurePolicy:             # a preempted pod (DisruptionTarget) is not a failure
        rules:
        - action: Ignore
          onPodConditions:
          - type: DisruptionTarget
      template:
        spec:
          subdomain: mp             # the headless Service: pods are mp-0.mp, mp-1.mp, ...
          restartPolicy: Never
          containers:
          - name: train
            image: my-registry/jaxjob-train:latest
            command: ["python", "examples/multiprocess.py", "--epochs", "100",
                      "--ckpt-dir", "gs://my-bucket/runs/mp"]
            env:
            - name: JAX_COORDINATOR_ADDRESS
              value: mp-0.mp:1234
            - name: JAX_NUM_PROCESSES
              value: "4"
            - name: JAX_PROCESS_ID
              valueFrom:
                fieldRef:
                  fieldPath: metadata.annotations['batch.kubernetes.io/job-completion-index']

Alone (``python examples/multiprocess.py``) it is a one-process job on the same checkpoint
format; a checkpoint resumes on another process count.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import jaxjob

jaxjob.distributed.initialize()  # first, before any other JAX call: joins the job, or nothing

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

SAMPLES, FEATURES, HIDDEN = 512, 8, 32
BATCH, STEPS = 32, 8  # the global batch (a multiple of the process count), steps per epoch
tx = optax.adam(1e-2)
log = logging.getLogger("multiprocess")
Params = dict[str, jax.Array]


def make_data() -> dict[str, npt.NDArray[np.float32]]:
    """A regression data set, the same on every process (each reads only its rows of it)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    w = rng.normal(size=(FEATURES,)).astype(np.float32)
    return {"x": x, "y": np.tanh(x @ w).astype(np.float32)}


def init_params(key: jax.Array) -> Params:
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (FEATURES, HIDDEN)) / np.sqrt(FEATURES),
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(k2, (HIDDEN,)) / np.sqrt(HIDDEN),
    }


def loss_fn(params: Params, batch: dict[str, jax.Array]) -> jax.Array:
    hidden = jax.nn.relu(batch["x"] @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] - batch["y"]) ** 2)


def build_job(epochs: int) -> jaxjob.Job:
    # One mesh axis over every device of every process (Auto: the tasks place arrays with
    # with_sharding_constraint, as in examples/digits.py).
    mesh = jax.make_mesh(
        (jax.device_count(),), ("batch",), axis_types=(jax.sharding.AxisType.Auto,)
    )
    replicated = NamedSharding(mesh, P())
    job = jaxjob.Job()

    @job.init_group.task
    def init(ws: jaxjob.Workspace) -> dict[str, Any]:
        params = jax.lax.with_sharding_constraint(init_params(jax.random.key(0)), replicated)
        return {"params": params, "opt_state": tx.init(params)}

    # Each process reads its rows of each global batch; ws["batch"] holds global arrays of
    # shape [STEPS, BATCH, ...], split over the processes along "batch".
    source = jaxjob.data.IndexCursor(make_data(), batch_size=BATCH, shuffle_seed=0)
    job.add_data("batch", source, steps=STEPS, sharding=NamedSharding(mesh, P(None, "batch")))

    @job.epoch_group.task
    def train_epoch(ws: jaxjob.Workspace) -> dict[str, Any]:
        def step(carry: tuple[Params, Any], batch: dict[str, jax.Array]) -> Any:
            params, opt_state = carry
            loss, grads = jax.value_and_grad(loss_fn)(params, batch)  # all-reduced by XLA
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        carry = (ws["params"], ws["opt_state"])
        (params, opt_state), losses = jax.lax.scan(step, carry, ws["batch"])
        return {"params": params, "opt_state": opt_state, "loss": losses.mean()}

    jaxjob.epoch_limiter(job, epochs)
    return job


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10, help="total epochs (default 10)")
    parser.add_argument(
        "--ckpt-dir", default="runs/mp", help="checkpoint directory, seen by every process"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", force=True)
    for name in ("multiprocess", "jaxjob"):  # what jaxjob did (resumed, finished) and the results
        logging.getLogger(name).setLevel(logging.INFO)
    job = build_job(args.epochs)
    runner = jaxjob.JobRunner(job, jaxjob.CheckpointManager(args.ckpt_dir), progress=["loss"])
    last = runner.train(jaxjob.Session())  # on every process; process 0 shows the progress
    if jax.process_index() == 0:
        log.info("done: epoch %d on %d processes", last, jax.process_count())


if __name__ == "__main__":
    main()
