"""A job for the Ctrl-C tests, run as a child process: saves a large workspace every epoch.

Usage: python interrupt_job.py CKPT_DIR [--size N] [--sigint-preempts]

Each epoch adds 1 to every element of ``w`` (``w = epoch + arange(size)``
after the epoch) and prints ``EPOCH <k>`` once it has run, before its save.
With ``--sigint-preempts`` SIGINT is a preemption signal too.
"""

import argparse
import signal

import jax.numpy as jnp

import jaxjob

EPOCHS = 40  # bounds the disk a run can fill (40 x 16 MiB) if no SIGINT ever comes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt")
    parser.add_argument("--size", type=int, default=1 << 22)
    parser.add_argument("--sigint-preempts", action="store_true")
    args = parser.parse_args()
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"w": jnp.arange(args.size, dtype=jnp.float32)})
    job.epoch_group.add(lambda ws: {"w": ws["w"] + 1})
    job.epoch_group.add(
        lambda ws: print(f"EPOCH {int(ws[jaxjob.job.EPOCH_COUNTER])}", flush=True), jit=False
    )
    jaxjob.epoch_limiter(job, EPOCHS)
    signals = (signal.SIGTERM, signal.SIGINT) if args.sigint_preempts else (signal.SIGTERM,)
    runner = jaxjob.JobRunner(job, jaxjob.CheckpointManager(args.ckpt), preemption_signals=signals)
    runner.train(jaxjob.Session())


if __name__ == "__main__":
    main()
