"""Train on a Grain pipeline whose position is checkpointed: a resumed run reads what was left.

The pipeline (shuffle, map, repeat, batch over a random-access source) feeds each epoch a
fixed number of batches through ``Job.add_data``; the position of its iterator (Grain's
``get_state()``) is saved with every checkpoint and given back to it (``set_state()``) after a
resume. Kill the run at any point (Ctrl-C, kill -9) and run the same command again: it resumes
from the last saved epoch and reads every record exactly as an uninterrupted run would, so the
final parameters are bit for bit the same. The job counts how many times it trained on each
record (``seen``, saved with the parameters): with the defaults, an epoch reads half the
records, so after an even number of epochs every record has been seen equally often.

    python -m pip install -c constraints.txt -e ".[grain]"  # once
    python examples/grain_pipeline.py --epochs 10 --ckpt-dir runs/grain

On several processes, give each process its own records (``records[jax.process_index() ::
jax.process_count()]``, or Grain's ``ShardByJaxProcess``): each saves its own iterator state.
``examples/multiprocess.py`` shows how a job's batches become global arrays (``add_data(...,
sharding=)``).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import grain.python as grain
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxjob

RECORDS, FEATURES = 48, 4
BATCH, STEPS = 8, 3  # records per batch, batches per epoch: an epoch reads half the records
tx = optax.sgd(0.3)
log = logging.getLogger("grain_pipeline")


def make_records() -> list[dict[str, Any]]:
    """The random-access source: any sequence of records (here, in memory)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(RECORDS, FEATURES)).astype(np.float32)
    return [{"id": np.int32(i), "x": row, "y": np.float32(row.sum())} for i, row in enumerate(x)]


def scale(record: dict[str, Any]) -> dict[str, Any]:
    """A per-record transformation of the pipeline."""
    return {**record, "x": record["x"] * np.float32(0.5)}


def pipeline(seed: int = 0) -> grain.MapDataset:
    """The records, shuffled anew on every pass, scaled, repeated, in batches of BATCH."""
    records = grain.MapDataset.source(make_records())
    return records.shuffle(seed=seed).map(scale).repeat(None).batch(BATCH, drop_remainder=True)


def build_job(epochs: int) -> jaxjob.Job:
    job = jaxjob.Job()

    @job.init_group.task
    def init(ws: jaxjob.Workspace) -> dict[str, Any]:
        params = {"w": jnp.zeros(FEATURES)}
        return {"params": params, "opt_state": tx.init(params), "seen": jnp.zeros(RECORDS, int)}

    # ws["batch"]: STEPS batches stacked, NumPy arrays; the iterator's state is saved as
    # "jaxjob/data/batch" with every checkpoint.
    job.add_data("batch", pipeline(), steps=STEPS)

    @job.epoch_group.task
    def train_epoch(ws: jaxjob.Workspace) -> dict[str, Any]:
        def step(carry: tuple[Any, Any], batch: dict[str, jax.Array]) -> Any:
            params, opt_state = carry
            loss, grads = jax.value_and_grad(
                lambda p: jnp.mean((batch["x"] @ p["w"] - batch["y"]) ** 2)
            )(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        carry = (ws["params"], ws["opt_state"])
        (params, opt_state), losses = jax.lax.scan(step, carry, ws["batch"])
        seen = ws["seen"].at[ws["batch"]["id"].reshape(-1)].add(1)
        return {"params": params, "opt_state": opt_state, "seen": seen, "loss": losses.mean()}

    jaxjob.epoch_limiter(job, epochs)
    return job


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10, help="total epochs (default 10)")
    parser.add_argument("--ckpt-dir", default="runs/grain", help="checkpoint directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", force=True)
    for name in ("grain_pipeline", "jaxjob"):  # what jaxjob did (resumed, finished), results
        logging.getLogger(name).setLevel(logging.INFO)
    session = jaxjob.Session()
    ckpt = jaxjob.CheckpointManager(args.ckpt_dir)
    runner = jaxjob.JobRunner(build_job(args.epochs), ckpt, progress=["loss"])
    last = runner.train(session)
    seen = np.asarray(session.workspace["seen"])
    log.info("done: epoch %d, each record seen %d to %d times", last, seen.min(), seen.max())


if __name__ == "__main__":
    main()
