"""Step slowdown: the transformer's epoch time saving every epoch against no saving.

    python benchmarks/step_slowdown.py DIR --epochs 10 --steps 10 --rounds 3

The 6.8M-parameter transformer of ``restart.py`` (parameters and Adam state:
78 MiB) trains ``--epochs`` epochs of ``--steps`` steps (about 1 s each on 2
cores) under ``JobRunner``, once with a ``CheckpointManager`` saving every
epoch and once without, in alternating fresh processes. Each epoch's time comes
from ``runner.history`` (``epoch_time_s``: compute plus the save's blocked part,
``save_time_s``); the first two epochs (compilation) are left out. Prints one
``RESULT {json}`` line: medians and the ratio saved / plain.
"""

import argparse
import json
import os
import shutil
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import result_of  # noqa: E402


def run(directory, epochs, steps):
    """One run; per-epoch (epoch_time_s, save_time_s) after the first two epochs."""
    import restart

    import jaxjob

    job = restart.transformer_job(epochs, steps)
    manager = jaxjob.CheckpointManager(directory) if directory else None
    runner = jaxjob.JobRunner(job, manager, progress=["loss"])
    runner.train(jaxjob.Session())
    rows = runner.history[2:]
    return [r["epoch_time_s"] for r in rows], [r["save_time_s"] for r in rows]


def child(kind, directory, args):
    argv = [__file__, directory, "--child", kind, "--epochs", str(args.epochs)]
    return result_of(argv + ["--steps", str(args.steps)], timeout=1800)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=["saved", "plain"])
    args = parser.parse_args()
    if args.child:
        directory = os.path.join(args.dir, "ckpt") if args.child == "saved" else None
        epoch_s, save_s = run(directory, args.epochs, args.steps)
        print("RESULT " + json.dumps({"epoch_s": epoch_s, "save_s": save_s}))
        return
    samples = {"saved": [], "plain": [], "blocked": []}
    for r in range(args.rounds):
        for kind in ("saved", "plain") if r % 2 == 0 else ("plain", "saved"):
            work = os.path.join(args.dir, f"{kind}{r}")
            found = child(kind, work, args)
            samples[kind] += found["epoch_s"]
            if kind == "saved":
                samples["blocked"] += found["save_s"]
            shutil.rmtree(work, ignore_errors=True)
    out = {k: statistics.median(v) for k, v in samples.items()}
    out["ratio"] = out["saved"] / out["plain"]
    out["epochs_measured"] = len(samples["plain"])
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
