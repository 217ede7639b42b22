"""A job for the Ctrl-C tests, run as a child process: saves a large workspace every epoch.

Usage: python interrupt_job.py CKPT_DIR [--size N] [--sigint-preempts]

Each epoch adds 1 to every element of ``w`` (``w = epoch + arange(size)``
after the epoch) and prints ``EPOCH <k>`` once it has run, before its save.
With ``--sigint-preempts`` SIGINT is a preemption signal too.
"""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import argparse
import signal
import time

import jax.numpy as jnp

import jaxjob

job_start.imported()

EPOCHS = 200  # bounds the disk a run can fill (200 x 16 MiB) if no SIGINT ever comes
PAUSE_S = 0.1  # per epoch, before it prints: 20 s at least, for a loaded test to send SIGINT


def _report(ws) -> None:
    """Pauses, then prints ``EPOCH <k>``: the epoch has run and its save comes next."""
    time.sleep(PAUSE_S)
    print(f"EPOCH {int(ws[jaxjob._src.core.job.EPOCH_COUNTER])}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt")
    parser.add_argument("--size", type=int, default=1 << 22)
    parser.add_argument("--sigint-preempts", action="store_true")
    args = parser.parse_args()
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"w": jnp.arange(args.size, dtype=jnp.float32)})
    job.epoch_group.add(lambda ws: {"w": ws["w"] + 1})
    job.epoch_group.add(_report, jit=False)
    jaxjob.epoch_limiter(job, EPOCHS)
    signals = (signal.SIGTERM, signal.SIGINT) if args.sigint_preempts else (signal.SIGTERM,)
    runner = jaxjob.JobRunner(job, jaxjob.CheckpointManager(args.ckpt), preemption_signals=signals)
    runner.train(jaxjob.Session())


if __name__ == "__main__":
    main()
