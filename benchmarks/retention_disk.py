"""Disk usage of the digits job's checkpoints with and without retention, measured in one run.

    python benchmarks/retention_disk.py --epochs 50

Trains the digits job for that many epochs twice, with the default (every epoch
kept) and with ``keep=jaxjob.keep.Last(3)``, and prints the bytes each leaves on
disk, the epochs kept and their ratio.
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import digits  # noqa: E402

import jaxjob  # noqa: E402


def disk_usage(path):
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(path)
        for name in names
    )


def run(num_epochs, ckpt_dir, keep):
    train, test = digits.load_data()
    ckpt = jaxjob.CheckpointManager(ckpt_dir, keep=keep)
    jaxjob.JobRunner(digits.build_job(train, test, num_epochs), ckpt).train(jaxjob.Session())
    ckpt.close()
    return disk_usage(ckpt_dir), ckpt.committed_epochs()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        everything, all_epochs = run(args.epochs, os.path.join(tmp, "all"), None)
        last3, kept = run(args.epochs, os.path.join(tmp, "last3"), jaxjob.keep.Last(3))
    print(f"keep=None:    {everything / 2**20:8.2f} MiB, {len(all_epochs)} epochs")
    print(f"keep=Last(3): {last3 / 2**20:8.2f} MiB, epochs {kept}")
    print(f"ratio: {everything / last3:.1f}x")


if __name__ == "__main__":
    main()
