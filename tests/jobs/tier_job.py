"""A two-tier job for the local-tier tests, run as a child process (1 process, or under launch).

Usage: python tier_job.py CKPT LOCAL OUT [--epochs N] [--persistent-every K]
    [--kill-in-epoch E] [--shift S]

CKPT is the persistent tier (a directory or s3://...), LOCAL the local tier's path (it may hold
``{process}``): a local save every epoch, a persistent one every K epochs (default 4). The state
is an Adam-trained linear model sharded over every device of the job, a PRNG key and a host-local
NumPy cursor. ``--kill-in-epoch E``: in epoch E, once the local save of epoch E - 1 is committed
on every process (and the newest persistent save before it), the last process kills itself with
SIGKILL (``jaxjob launch`` then stops the
others). Otherwise it trains N epochs (default 10), prints ``TIERS <saved_to per epoch>`` and
writes the final workspace to OUT (``jaxjob.testing.dump_workspace``). ``--shift S`` moves the
training data by S: a life of the job that computes other values.
"""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import argparse
import logging
import os
import signal
import time

from etils import epath

import jaxjob.distributed

jaxjob.distributed.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxjob  # noqa: E402
from jaxjob import testing  # noqa: E402

job_start.imported()

tx = optax.adam(1e-2)


def build_job(args) -> jaxjob.Job:
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rows = NamedSharding(mesh, P("data"))
    job = jaxjob.Job()

    @job.init_group.task
    def init(ws):
        k1, k2 = jax.random.split(jax.random.key(0))
        w = jax.lax.with_sharding_constraint(jax.random.normal(k1, (16, 4)), rows)
        return {"params": {"w": w}, "opt_state": tx.init({"w": w}), "rng": k2}

    @job.init_group.task(jit=False)
    def cursor(ws):
        return {"cursor": np.int64(0)}

    @job.epoch_group.task
    def train(ws):
        rng, key = jax.random.split(ws["rng"])
        x = jax.random.normal(key, ws["params"]["w"].shape)
        if args.shift:
            x = x + args.shift

        def loss(params):
            return jnp.mean((params["w"] - x) ** 2)

        value, grads = jax.value_and_grad(loss)(ws["params"])
        updates, opt_state = tx.update(grads, ws["opt_state"], ws["params"])
        params = optax.apply_updates(ws["params"], updates)
        return {"params": params, "opt_state": opt_state, "rng": rng, "loss": value}

    @job.epoch_group.task(jit=False)
    def advance(ws):
        epoch = int(ws[jaxjob._src.core.job.EPOCH_COUNTER]) + 1  # it counts after this task
        if epoch == args.kill_in_epoch:
            durable = (epoch - 1) // args.persistent_every * args.persistent_every
            _kill_once_committed(args.local, epoch - 1, epath.Path(args.ckpt) / f"local.{durable}")
        return {"cursor": np.int64(ws["cursor"] + 1)}

    jaxjob.epoch_limiter(job, args.epochs)
    return job


def _kill_once_committed(local: str, epoch: int, durable: epath.Path) -> None:
    """Once every process's local save of ``epoch`` and the persistent ``durable`` are committed,
    the last process dies."""
    if jax.process_index() != jax.process_count() - 1:
        return  # the other processes go on to the next exchange, where launch stops them
    deadline = time.monotonic() + 60
    paths = [
        epath.Path(local.format(process=p)) / f"local.{epoch}" for p in range(jax.process_count())
    ]
    while not all((p / "commit_success.txt").exists() for p in [*paths, durable]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the saves {paths + [durable]} did not commit within 60 s")
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt")
    parser.add_argument("local")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--persistent-every", type=int, default=4)
    parser.add_argument("--kill-in-epoch", type=int)
    parser.add_argument("--shift", type=float, default=0.0)  # other values: another life's
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", force=True)
    ckpt = jaxjob.CheckpointManager(args.ckpt, local=jaxjob.LocalTier(args.local))
    runner = jaxjob.JobRunner(build_job(args), ckpt, save_every_epochs=args.persistent_every)
    session = jaxjob.Session()
    runner.train(session)
    if jax.process_index() == 0:
        print("TIERS", " ".join(str(r.get("saved_to")) for r in runner.history), flush=True)
    testing.dump_workspace(session.workspace, args.out)


if __name__ == "__main__":
    main()
