"""A job for the long-run tests (retention, lock, disk full), run as a child process.

Usage: python long_job.py CKPT_DIR OUT_NPZ [--epochs N] [--keep EXPR] [--size N]
       [--sleep-per-epoch S] [--on-save-error warn|raise]

``--keep`` is a Python expression over ``keep`` (``jaxjob.keep``), e.g.
``"[keep.Last(1), keep.Best('score')]"``. Each epoch outputs ``score``, which
peaks at epoch 4. The child prints ``SAVE_ERRORS [epochs]`` and ``finished at
epoch N``, writes the final workspace to OUT_NPZ, and exits 3 printing
``IN_USE <message>`` on :class:`jaxjob.CheckpointInUseError`. It also runs
under ``jaxjob launch -n 2``.
"""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import argparse
import json
import logging
import sys
import time

import jaxjob

jaxjob.distributed.initialize()

import jax  # noqa: E402
from exact_job import dump  # noqa: E402

from jaxjob._src.core.job import EPOCH_COUNTER  # noqa: E402

job_start.imported()


def build_job(epochs: int, size: int, sleep_per_epoch: float) -> jaxjob.Job:
    job = jaxjob.Job()

    @job.init_group.task
    def init(ws):
        k1, k2 = jax.random.split(jax.random.key(0))
        return {"w": jax.random.normal(k1, (size,)), "rng": k2}

    @job.epoch_group.task
    def train_epoch(ws):
        rng, noise = jax.random.split(ws["rng"])
        w = 0.9 * ws["w"] + 0.1 * jax.random.normal(noise, ws["w"].shape)
        epoch = ws[EPOCH_COUNTER] + 1
        return {"w": w, "rng": rng, "score": -((epoch - 4.0) ** 2)}

    if sleep_per_epoch:
        job.epoch_group.add(lambda ws: time.sleep(sleep_per_epoch), jit=False)
    jaxjob.epoch_limiter(job, epochs)
    return job


def reference(out, epochs: int = 8, size: int = 64) -> None:
    """Writes the final workspace of an uninterrupted run without checkpoints to ``out``."""
    session = jaxjob.Session()
    jaxjob.JobRunner(build_job(epochs, size, 0.0)).train(session)
    dump(session.workspace, out)


def main(argv):
    logging.basicConfig(level=logging.INFO, force=True)
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt_dir")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--keep")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--sleep-per-epoch", type=float, default=0.0)
    parser.add_argument("--on-save-error", default="warn")
    args = parser.parse_args(argv)
    policy = eval(args.keep, {"keep": jaxjob.keep}) if args.keep else None
    ckpt = jaxjob.CheckpointManager(args.ckpt_dir, keep=policy)
    runner = jaxjob.JobRunner(
        build_job(args.epochs, args.size, args.sleep_per_epoch),
        ckpt,
        on_save_error=args.on_save_error,
    )
    session = jaxjob.Session()
    try:
        last = runner.train(session)
    except jaxjob.CheckpointInUseError as err:
        print(f"IN_USE {err}", flush=True)
        sys.exit(3)
    finally:
        print("SAVE_ERRORS", json.dumps([e.epoch for e in runner.save_errors]), flush=True)
    ckpt.close()
    print(f"finished at epoch {last}", flush=True)
    if jax.process_index() == 0:
        dump(session.workspace, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
