"""Seconds per epoch of the digits job with and without checkpointing, measured in the same run.

    python benchmarks/checkpoint_overhead.py --epochs 30

Prints the median epoch time of each variant and their ratio (machines here are
shared and noisy: compare the ratio, not absolute times).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import digits  # noqa: E402
import jax  # noqa: E402

import jaxjob  # noqa: E402


def epoch_times(num_epochs, ckpt_dir):
    train, test = digits.load_data()
    job = digits.build_job(train, test, num_epochs)
    stamps = []
    job.epoch_group.add(
        lambda ws: stamps.append(jax.block_until_ready(ws["params"]) and time.perf_counter()),
        jit=False,
    )
    ckpt = jaxjob.CheckpointManager(ckpt_dir) if ckpt_dir else None
    jaxjob.JobRunner(job, ckpt).train(jaxjob.Session())
    return [b - a for a, b in zip(stamps[1:], stamps[2:], strict=False)]  # skip compilation


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    plain = statistics.median(epoch_times(args.epochs, None))
    with tempfile.TemporaryDirectory() as d:
        saved = statistics.median(epoch_times(args.epochs, d))
    print(f"median s/epoch without checkpoints: {plain:.4f}")
    print(f"median s/epoch with async checkpoint every epoch: {saved:.4f}")
    print(f"ratio (with / without): {saved / plain:.2f}")


if __name__ == "__main__":
    main()
