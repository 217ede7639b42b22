"""A training job for the exactness tests, run as a child process.

Usage: python exact_job.py CKPT_DIR OUT_NPZ [--die-in-epoch K | --die-after-save K]
    [--term-in-epoch K [--term-again]] [--save-every-epochs N] [--no-preemption]

Dies with SIGKILL at the asked-for moment, or sends itself SIGTERM in epoch K
(--term-again: once more while the preempted epoch's save commits; a
preemption prints ``PREEMPTED <epoch>`` and lets ``jaxjob.Preempted``
propagate); otherwise trains 6 epochs and writes the final workspace (leaf
bytes, dtypes and pytree structure) to OUT_NPZ. The download and exit groups
print ``DOWNLOAD RAN`` and ``EXIT RAN``.
"""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import argparse
import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxjob

job_start.imported()

EPOCHS = 6
tx = optax.adam(1e-2)


def _signal_in_epoch(job: jaxjob.Job, epoch: int, sig: signal.Signals) -> None:
    @job.epoch_group.task(jit=False)
    def send_signal(ws):
        if int(ws[jaxjob._src.core.job.EPOCH_COUNTER]) == epoch:
            os.kill(os.getpid(), sig)


def build_job(die_in_epoch: int | None, term_in_epoch: int | None = None) -> jaxjob.Job:
    job = jaxjob.Job()

    @job.init_group.task
    def init(ws):
        k1, k2 = jax.random.split(jax.random.key(0))
        params = {"w": jax.random.normal(k1, (8, 4)), "b": jnp.zeros(4)}
        return {
            "params": params,
            "opt_state": tx.init(params),
            "rng": k2,
            "ema": jnp.zeros((8, 4), jnp.bfloat16),
        }

    @job.epoch_group.task
    def train_epoch(ws):
        rng, data_key = jax.random.split(ws["rng"])
        xs = jax.random.normal(data_key, (5, 16, 8))

        def step(carry, x):
            params, opt_state = carry
            loss, grads = jax.value_and_grad(lambda p: jnp.mean((x @ p["w"] + p["b"]) ** 2))(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, opt_state), losses = jax.lax.scan(step, (ws["params"], ws["opt_state"]), xs)
        ema = (0.9 * ws["ema"] + 0.1 * params["w"]).astype(jnp.bfloat16)
        return {
            "params": params,
            "opt_state": opt_state,
            "rng": rng,
            "ema": ema,
            "loss": losses.mean(),
        }

    jaxjob.epoch_limiter(job, EPOCHS)
    if die_in_epoch is not None:
        _signal_in_epoch(job, die_in_epoch, signal.SIGKILL)
    if term_in_epoch is not None:
        _signal_in_epoch(job, term_in_epoch, signal.SIGTERM)
    job.download_group.add(lambda ws: print("DOWNLOAD RAN", flush=True), jit=False)
    job.exit_group.add(lambda ws: print("EXIT RAN", flush=True), jit=False)
    return job


class DyingManager(jaxjob.CheckpointManager):
    """Dies right after save() returns for one epoch: the async write is in flight."""

    def __init__(self, db_prefix, die_after_save):
        super().__init__(db_prefix)
        self.die_after_save = die_after_save

    def save(self, epoch, workspace, *, outputs=None):
        super().save(epoch, workspace, outputs=outputs)
        if epoch == self.die_after_save:
            os.kill(os.getpid(), signal.SIGKILL)


class SignallingManager(jaxjob.CheckpointManager):
    """Sends itself SIGTERM when the runner waits for the last save to commit."""

    def wait_until_finished(self):
        os.kill(os.getpid(), signal.SIGTERM)
        super().wait_until_finished()


def dump(ws, path):
    leaves, treedef = jax.tree_util.tree_flatten_with_path(ws)
    arrays, kinds = {}, []
    for i, (keypath, leaf) in enumerate(leaves):
        kinds.append(
            f"{jax.tree_util.keystr(keypath)}:{type(leaf).__name__}:{leaf.dtype}:{leaf.sharding}"
        )
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        arrays[f"leaf{i}"] = np.asarray(leaf).reshape(-1).view(np.uint8)
    np.savez(path, treedef=str(treedef), kinds=np.array(kinds), **arrays)


def assert_same_workspace(a, b):
    """The workspaces ``dump`` wrote to ``a`` and ``b`` are bitwise equal (types, shardings)."""
    with np.load(a) as x, np.load(b) as y:
        assert str(x["treedef"]) == str(y["treedef"])
        assert list(x["kinds"]) == list(y["kinds"])
        for name in x.files:
            np.testing.assert_array_equal(x[name], y[name], err_msg=name)


def train(prefix, handler=None):
    """Trains the job in this process under ``prefix`` (auto-resume): (last epoch, workspace)."""
    session = jaxjob.Session()
    ckpt = jaxjob.CheckpointManager(prefix, metadata_handler=handler)
    last = jaxjob.JobRunner(build_job(None), ckpt).train(session)
    ckpt.close()
    return last, session.workspace


def run(ckpt, out, *extra, expect=0):
    """Runs this script in a child process and checks its exit status."""
    proc = subprocess.run(
        [sys.executable, __file__, str(ckpt), str(out), *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == expect, proc.stderr[-2000:]
    return proc


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt_dir")
    parser.add_argument("out")
    parser.add_argument("--die-in-epoch", type=int)
    parser.add_argument("--die-after-save", type=int)
    parser.add_argument("--sleep-per-epoch", type=float, default=0.0)
    parser.add_argument("--term-in-epoch", type=int)
    parser.add_argument("--term-again", action="store_true")
    parser.add_argument("--save-every-epochs", type=int, default=1)
    parser.add_argument("--no-preemption", action="store_true")
    args = parser.parse_args(argv)
    job = build_job(args.die_in_epoch, args.term_in_epoch)
    if args.sleep_per_epoch:
        import time

        job.epoch_group.add(lambda ws: time.sleep(args.sleep_per_epoch), jit=False)
    if args.die_after_save is not None:
        ckpt = DyingManager(args.ckpt_dir, args.die_after_save)
    elif args.term_again:
        ckpt = SignallingManager(args.ckpt_dir)
    else:
        ckpt = jaxjob.CheckpointManager(args.ckpt_dir)
    session = jaxjob.Session()
    runner = jaxjob.JobRunner(
        job,
        ckpt,
        save_every_epochs=args.save_every_epochs,
        preemption_signals=() if args.no_preemption else (signal.SIGTERM,),
    )
    try:
        last = runner.train(session)
    except jaxjob.Preempted as err:
        print(f"PREEMPTED {err.epoch}", flush=True)
        raise
    print(f"finished at epoch {last}", flush=True)
    dump(session.workspace, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
