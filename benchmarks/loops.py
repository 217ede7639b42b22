"""Epoch-loop benchmarks, each in a fresh process; prints one ``RESULT {json}`` line.

    python benchmarks/loops.py loop DIR --epochs 12     # JobRunner vs a hand-written jit+Orbax loop
    python benchmarks/loops.py overlap DIR --mib 1024   # compute slowed by a background save
    python benchmarks/loops.py digits DIR --epochs 30   # digits s/epoch without and with saves

``loop`` and ``overlap`` run the same epoch function (~0.2 s of matmuls on a
16 MiB state); each variant alternates with the other ``--rounds`` times. The hand
loop uses Orbax's default ``CheckpointManager``: TensorStore fsyncs its data files,
but its JSON metadata files and the committed directory's rename are not fsynced
(jaxjob's commit is durable).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from common import workspace_arrays  # noqa: E402

import jaxjob  # noqa: E402

SIZE = 1024


def init_state():
    key = jax.random.key(0)
    return {"w": jax.random.normal(key, (SIZE, SIZE)) / SIZE**0.5, "v": jnp.zeros(3 * 2**20)}


def epoch(state, repeats):
    def body(_, w):
        return jnp.tanh(w @ w) / 1.5

    w = jax.lax.fori_loop(0, repeats, body, state["w"])
    return {"w": w, "v": state["v"] + w[0, 0]}


def _runner_loop(directory, epochs, repeats):
    job = jaxjob.Job()
    job.init_group.add(lambda ws: init_state(), name="init")
    job.epoch_group.add(lambda ws: epoch(ws, repeats), name="epoch")
    stamps = []
    job.epoch_group.add(
        lambda ws: stamps.append(
            jax.block_until_ready(ws["w"]) is not None and time.perf_counter()
        ),
        jit=False,
    )
    jaxjob.epoch_limiter(job, num_epochs=epochs)
    runner = jaxjob.JobRunner(job, jaxjob.CheckpointManager(directory) if directory else None)
    runner.train(jaxjob.Session())
    return [b - a for a, b in zip(stamps[1:], stamps[2:], strict=False)]


def _hand_loop(directory, epochs, repeats):
    import orbax.checkpoint as ocp

    step = jax.jit(lambda s: epoch(s, repeats))
    manager = ocp.CheckpointManager(directory)
    state = jax.jit(init_state)()
    manager.save(0, args=ocp.args.StandardSave(state))
    stamps = []
    for e in range(1, epochs + 1):
        state = jax.block_until_ready(step(state))
        stamps.append(time.perf_counter())
        manager.save(e, args=ocp.args.StandardSave(state))
    manager.wait_until_finished()
    manager.close()
    return [b - a for a, b in zip(stamps[1:], stamps[2:], strict=False)]


def calibrate(target_s=0.2):
    """Matmuls per epoch that make an epoch last about ``target_s`` on this machine."""
    step = jax.jit(lambda s: epoch(s, 4))
    state = jax.block_until_ready(step(jax.jit(init_state)()))
    times = []
    for _ in range(3):
        start = time.perf_counter()
        state = jax.block_until_ready(step(state))
        times.append(time.perf_counter() - start)
    return max(1, round(target_s / (min(times) / 4)))


def loop(args):
    times = {"jobrunner": [], "hand_orbax": [], "no_checkpoint": []}
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(dir=args.dir) as d:
            times["jobrunner"] += _runner_loop(os.path.join(d, "a"), args.epochs, args.repeats)
            times["hand_orbax"] += _hand_loop(os.path.join(d, "b"), args.epochs, args.repeats)
            if r == 0:
                times["no_checkpoint"] += _runner_loop(None, args.epochs, args.repeats)
    return {k: statistics.median(v) for k, v in times.items()} | {"samples": times}


def overlap(args):
    step = jax.jit(lambda s: epoch(s, args.repeats))
    state = jax.block_until_ready(step(jax.jit(init_state)()))
    big = {k: jax.device_put(v) for k, v in workspace_arrays(4, args.mib * 2**18).items()}
    alone, overlapped = [], []
    for r in range(args.rounds):
        start = time.perf_counter()
        state = jax.block_until_ready(step(state))
        alone.append(time.perf_counter() - start)
        ckpt = jaxjob.CheckpointManager(os.path.join(args.dir, f"overlap{r}"))
        ckpt.save(0, big)
        start = time.perf_counter()
        state = jax.block_until_ready(step(state))
        overlapped.append(time.perf_counter() - start)
        ckpt.wait_until_finished()
        ckpt.close()
    return {"alone": statistics.median(alone), "overlapped": statistics.median(overlapped)}


def digits(args):
    from checkpoint_overhead import epoch_times

    plain, saved = [], []
    for _ in range(args.rounds):
        plain += epoch_times(args.epochs, None)
        with tempfile.TemporaryDirectory(dir=args.dir) as d:
            saved += epoch_times(args.epochs, d)
    return {"plain": statistics.median(plain), "saved": statistics.median(saved)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["loop", "overlap", "digits"])
    parser.add_argument("dir")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=0, help="matmuls per epoch (0: ~0.2 s)")
    parser.add_argument("--mib", type=int, default=1024, help="overlap: size of the save")
    args = parser.parse_args()
    if args.repeats == 0:
        args.repeats = calibrate()
    result = {"loop": loop, "overlap": overlap, "digits": digits}[args.mode](args)
    print("RESULT " + json.dumps(result | {"matmuls_per_epoch": args.repeats}), flush=True)


if __name__ == "__main__":
    main()
