"""Train an MLP on scikit-learn's bundled digits with optax, checkpointing every epoch.

Run it, interrupt it (Ctrl-C or kill -9), run it again: it resumes from the
last finished epoch and ends exactly where an uninterrupted run would.

    python examples/digits.py --epochs 10 --ckpt-dir runs/digits

The same script runs unchanged on several processes: each minibatch is sharded
over every device of every process (data parallel), parameters are replicated.

    jaxjob launch -n 2 --devices-per-process 2 -- python examples/digits.py --ckpt-dir runs/d2
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from sklearn.datasets import load_digits

import jaxjob

BATCH = 64
tx = optax.adam(1e-3)
Split = tuple[npt.NDArray[np.float32], npt.NDArray[np.int32]]  # (inputs, labels)
Params = list[dict[str, jax.Array]]  # one {"w", "b"} per layer


def load_data() -> tuple[Split, Split]:
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    split = len(x) * 4 // 5
    return (x[:split], y[:split]), (x[split:], y[split:])


def init_params(key: jax.Array, sizes: tuple[int, ...] = (64, 128, 10)) -> Params:
    params: Params = []
    for k, (m, n) in zip(
        jax.random.split(key, len(sizes) - 1), zip(sizes, sizes[1:], strict=False), strict=True
    ):
        params.append({"w": jax.random.normal(k, (m, n)) * jnp.sqrt(2.0 / m), "b": jnp.zeros(n)})
    return params


def predict(params: Params, x: jax.typing.ArrayLike) -> jax.Array:
    x = jnp.asarray(x)
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(predict(params, x), y))


def build_job(train: Split, test: Split, num_epochs: int) -> jaxjob.Job:
    (x_train, y_train), (x_test, y_test) = train, test
    steps = len(x_train) // BATCH
    # One mesh axis over every device of every process: batches are split over it. Auto axes,
    # because the tasks place arrays with jax.lax.with_sharding_constraint and let XLA lay out
    # the rest; that refuses Explicit axes, jax.make_mesh's default in JAX 0.10. With Explicit
    # axes, pass the mesh to JobRunner(..., mesh=mesh) and use jax.sharding.reshard(x, P(...)).
    mesh = jax.make_mesh(
        (jax.device_count(),), ("batch",), axis_types=(jax.sharding.AxisType.Auto,)
    )
    replicated = NamedSharding(mesh, P())
    job = jaxjob.Job()

    @job.init_group.task
    def init(ws: jaxjob.Workspace) -> dict[str, Any]:
        params = jax.lax.with_sharding_constraint(init_params(jax.random.key(0)), replicated)
        return {"params": params, "opt_state": tx.init(params), "rng": jax.random.key(1)}

    @job.epoch_group.task
    def train_epoch(ws: jaxjob.Workspace) -> dict[str, Any]:
        rng, shuffle_key = jax.random.split(ws["rng"])
        order = jax.random.permutation(shuffle_key, len(x_train))[: steps * BATCH]
        batches = NamedSharding(mesh, P(None, "batch"))
        xs = jnp.asarray(x_train)[order].reshape(steps, BATCH, -1)
        ys = jnp.asarray(y_train)[order].reshape(steps, BATCH)
        xs, ys = jax.lax.with_sharding_constraint((xs, ys), batches)

        def step(carry: tuple[Params, Any], batch: tuple[jax.Array, jax.Array]) -> Any:
            params, opt_state = carry
            loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, opt_state), losses = jax.lax.scan(step, (ws["params"], ws["opt_state"]), (xs, ys))
        accuracy = (predict(params, x_test).argmax(-1) == y_test).mean()
        return {
            "params": params,
            "opt_state": opt_state,
            "rng": rng,
            "loss": losses.mean(),
            "accuracy": accuracy,
        }

    jaxjob.epoch_limiter(job, num_epochs)
    return job


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10, help="total epochs (default 10)")
    parser.add_argument("--ckpt-dir", default="runs/digits", help="checkpoint directory")
    parser.add_argument("--no-checkpoint", action="store_true", help="train without checkpoints")
    parser.add_argument("--save-every-epochs", type=int, default=1, help="epochs between saves")
    parser.add_argument(
        "--save-every-seconds", type=float, help="seconds between saves (with epochs: either)"
    )
    parser.add_argument(
        "--local-dir",
        help="a second, per-process tier on local disk, saved every epoch (may hold {process}); "
        "the --save-every-* schedule then applies to --ckpt-dir alone",
    )
    args = parser.parse_args(argv)
    jaxjob.distributed.initialize()  # under `jaxjob launch` or a cluster; alone: nothing
    logging.basicConfig(level=logging.WARNING)
    train, test = load_data()
    job = build_job(train, test, args.epochs)
    local = jaxjob.LocalTier(args.local_dir) if args.local_dir else None
    ckpt = None if args.no_checkpoint else jaxjob.CheckpointManager(args.ckpt_dir, local=local)
    session = jaxjob.Session()
    start = time.perf_counter()
    runner = jaxjob.JobRunner(
        job,
        ckpt,
        progress=["loss", "accuracy"],  # a line or a bar per epoch
        save_every_epochs=args.save_every_epochs,
        save_every_seconds=args.save_every_seconds,
    )
    last = runner.train(session)  # on SIGTERM: saves the epoch, raises jaxjob.Preempted
    params = session.workspace["params"]
    _, (x_test, y_test) = train, test
    accuracy = float((predict(params, x_test).argmax(-1) == y_test).mean())
    if jax.process_index() == 0:
        seconds = time.perf_counter() - start
        print(f"done: epoch {last}, test accuracy {accuracy:.4f}, {seconds:.2f}s")


if __name__ == "__main__":
    main()
