"""Ctrl-C at random moments, many times in one process (test_interrupt.py), each on a fresh runner.

Usage: python interrupt_rounds.py ROOT ROUNDS [--seed S] [--size N] [--local]

Each round trains a job (``w = epoch + arange(size)``, a save every epoch, ``progress=["loss"]``)
into ``ROOT/<round>``; a timer thread, started by the first epoch (the third with ``--local``),
sends SIGINT to the main thread at a random moment of the next few epochs (in an epoch, its
save or the wait for it);
after the KeyboardInterrupt the round reads every leaf of ``session.workspace`` (``np.asarray``)
and checks that it holds the values of an epoch that completed: its epoch counter is one the
epoch group reached (or 0), at most one behind the newest, and ``w`` matches it. It prints
``ROUND {json}`` per round (``problem`` is None when it holds), then ``DONE``. With ``--local``
the manager has a local tier (``ROOT/<round>-local``, every epoch) and the persistent tier
saves every 4th epoch: an epoch restored into the session comes from either tier.
"""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import argparse
import json
import logging
import os
import random
import shutil
import signal
import threading
import time

import jax.numpy as jnp
import numpy as np

import jaxjob
from jaxjob._src.core.job import EPOCH_COUNTER

job_start.imported()

COUNTER = EPOCH_COUNTER
HOST_S = 0.01  # the host task after the jitted program: an interrupt often lands after a donation
WINDOW_S = 0.3  # the interrupt comes this long at most after the first epoch's host task began


class _Restored(logging.Handler):
    """Counts the runner's lines saying that it restored a committed epoch into the session."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record):
        if "restored into the session" in record.getMessage():
            self.count += 1


def _job(size, reached, arm, arm_at):
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"w": jnp.arange(size, dtype=jnp.float32)})
    job.epoch_group.add(lambda ws: {"w": ws["w"] + 1, "loss": jnp.mean(ws["w"])})

    def host(ws):  # runs after the program that donated the previous epoch's w
        if len(reached) == arm_at - 1:
            arm()  # epoch arm_at has run its program: interrupt within the next few
        time.sleep(HOST_S)
        reached.append(int(ws[COUNTER]) + 1)  # the limiter's task, last, counts this epoch

    job.epoch_group.add(host, jit=False)
    jaxjob.epoch_limiter(job, 100_000)
    return job


def _check(session, reached, size):
    """None if every leaf reads and the workspace is a completed epoch's; else what is wrong."""
    try:
        leaves = {k: np.asarray(v) for k, v in session.workspace.items()}
    except RuntimeError as err:  # "Array has been deleted"
        return f"a leaf does not read: {err}"
    if not leaves:
        return None if not reached else f"an empty workspace after epochs {reached[-3:]}"
    counter = int(leaves[COUNTER])
    newest = reached[-1] if reached else 0
    if counter not in (0, *reached) or counter < newest - 1:
        return f"epoch counter {counter}, the epoch group reached {reached[-3:]}"
    expected = counter + np.arange(size, dtype=np.float32)
    if not np.array_equal(leaves["w"], expected):
        return f"w is not epoch {counter}'s: w[:3]={leaves['w'][:3]}"
    return None


def _round(root, index, rng, size, restored, local):
    reached = []
    delay = rng.uniform(0.0, WINDOW_S)
    main = threading.main_thread().ident
    timer = threading.Timer(delay, signal.pthread_kill, (main, signal.SIGINT))
    tier = jaxjob.LocalTier(os.path.join(root, f"{index}-local")) if local else None
    ckpt = jaxjob.CheckpointManager(os.path.join(root, str(index)), local=tier)
    runner = jaxjob.JobRunner(
        _job(size, reached, timer.start, arm_at=3 if local else 1),  # local epochs 1, 2 first
        ckpt,
        progress=["loss"],
        save_every_epochs=4 if local else 1,
    )
    session = jaxjob.Session()
    before = restored.count
    try:
        runner.train(session)
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
    timer.join()
    problem = _check(session, reached, size)
    ckpt.close()
    for made in (str(index), f"{index}-local"):
        if os.path.exists(os.path.join(root, made)):  # not made if interrupted early
            shutil.rmtree(os.path.join(root, made))
    record = {
        "round": index,
        "delay": round(delay, 3),
        "interrupted": interrupted,
        "epochs": len(reached),
        "restored": restored.count > before,
        "problem": problem,
    }
    print("ROUND " + json.dumps(record), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("rounds", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--local", action="store_true")
    args = parser.parse_args()
    restored = _Restored()
    logging.getLogger("jaxjob").addHandler(restored)
    logging.getLogger("jaxjob").setLevel(logging.INFO)
    rng = random.Random(args.seed)
    for index in range(args.rounds):
        _round(args.root, index, rng, args.size, restored, args.local)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
