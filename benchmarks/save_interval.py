"""Seconds per epoch of the digits job: no checkpoints, a save every epoch, a save every 10 s.

    python benchmarks/save_interval.py --epochs 300 --rounds 3

The three variants run in the same process, one after the other, ``--rounds``
times (machines here are shared and noisy: compare the ratios, not absolute
times). Each round's mean excludes the first two epochs (compilation) and
includes the saves: with ``save_every_seconds=10`` only epoch 0, the final epoch
and one epoch every 10 s are saved. Prints the median over rounds of each
variant's mean and median epoch time, and the ratios to the run without checkpoints.
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

VARIANTS = {
    "no checkpoints": None,
    "save every epoch": {"save_every_epochs": 1},
    "save_every_seconds=10": {"save_every_epochs": None, "save_every_seconds": 10},
}


def epoch_times(data, num_epochs, options):
    """Per-epoch seconds (compilation excluded) and the committed epochs of one run."""
    job = digits.build_job(*data, num_epochs)
    stamps = []
    job.epoch_group.add(
        lambda ws: stamps.append(jax.block_until_ready(ws["params"]) and time.perf_counter()),
        jit=False,
    )
    with tempfile.TemporaryDirectory() as d:
        ckpt = jaxjob.CheckpointManager(d) if options is not None else None
        jaxjob.JobRunner(job, ckpt, **(options or {})).train(jaxjob.Session())
        saved = ckpt.committed_epochs() if ckpt else []
        if ckpt is not None:
            ckpt.close()  # releases the directory's lock before the directory goes
    return [b - a for a, b in zip(stamps[1:], stamps[2:], strict=False)], saved


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    data = digits.load_data()
    epoch_times(data, 10, None)  # warm-up: the first run in a process is slower
    means = {name: [] for name in VARIANTS}
    medians = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, options in VARIANTS.items():
            times, saved = epoch_times(data, args.epochs, options)
            means[name].append(statistics.fmean(times))
            medians[name].append(statistics.median(times))
            print(f"  {name}: {len(saved)} epochs saved", flush=True)
    base = statistics.median(means["no checkpoints"])
    print(f"digits, {args.epochs} epochs, median of {args.rounds} rounds:")
    for name in VARIANTS:
        mean, median = statistics.median(means[name]), statistics.median(medians[name])
        print(
            f"{name:>22}: mean {mean:.4f} s/epoch (median {median:.4f}), "
            f"{mean / base:.2f}x no checkpoints"
        )
    every, timed = (
        statistics.median(means["save every epoch"]),
        statistics.median(means["save_every_seconds=10"]),
    )
    print(f"save every epoch / save_every_seconds=10: {every / timed:.2f}x")


if __name__ == "__main__":
    main()
