"""Two tiers (jaxjob.LocalTier): what a local copy costs, and the work it saves on a kill.

    python benchmarks/two_tiers.py [--mib 1024] [--rounds 3] [--reads 3] [--quick]

Every figure is a ratio to a reference measured in the same run, on this machine:

* a local save of a MIB-MiB workspace (4 float32 leaves) to a RAM disk (/dev/shm), from
  ``tier("local").save`` to its durable commit, against a raw write+fsync of the same bytes
  there; the training thread's blocked part of it against the commit; and the same for a
  persistent save to local disk (the blocked part of each);
* a resume from the local copy (``restore`` of the whole workspace) against a raw read of the
  same bytes from the RAM disk (``--reads`` of each per round, alternating), in wall time and
  in this process's CPU time (user + system: on a machine that other work keeps busy, the
  restore's several threads get a larger share of the cores than the raw read's one); the
  minor page faults of each are printed too;
* the digits example's epoch time with no checkpoint, saving to the local tier every epoch,
  and saving to the persistent tier every epoch (``examples/digits.py``, fresh processes);
* the work a kill at a random moment loses (epochs run again), with a local copy every epoch
  and a persistent one every 10, against a persistent one every 10 alone: a 20-epoch job of
  ~0.25 s epochs, its epoch ends and commits timed, then 2000 kill moments drawn uniformly
  over the run (each loses the epochs finished since the newest commit before it).
"""

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import result_of, summary, timed, workspace_arrays

import jaxjob
from jaxjob._src.checkpoint.listing import list_tiers

HERE = os.path.dirname(os.path.abspath(__file__))
DIGITS = os.path.join(HERE, "..", "examples", "digits.py")
SHM = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _raw(arrays, root):
    """write+fsync of ``arrays`` as plain files under ``root``: (its seconds, a read of them)."""
    os.makedirs(root)

    def write():
        for name, a in arrays.items():
            with open(os.path.join(root, name), "wb") as f:
                a.tofile(f)
                f.flush()
                os.fsync(f.fileno())
        fd = os.open(root, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    def read():
        return {n: np.fromfile(os.path.join(root, n), np.float32) for n in arrays}

    return timed(write)[0], read


def _costed(fn, *args):
    """(seconds, {"cpu_s", "faults"} of this process, result) of one call (minor page faults)."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    seconds, result = timed(fn, *args)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return seconds, {"cpu_s": cpu, "faults": after.ru_minflt - before.ru_minflt}, result


def _reads(read, local, reads, rows, costs):
    """``reads`` times: a raw read, then a restore of the local copy (alternating)."""
    for _ in range(reads):
        for name, call in (("raw_read", read), ("local_restore", lambda: jaxjob.restore(local))):
            seconds, cost, result = _costed(call)
            rows[name].append(seconds)
            for key, value in cost.items():
                costs[f"{name}_{key}"].append(value)
            del result


def _saves(mib, rounds, reads):
    arrays = workspace_arrays(4, mib * 2**20 // 4)
    ws = {"params": {k: jnp.asarray(v) for k, v in arrays.items()}}
    rows = {k: [] for k in ("raw_write", "raw_read", "local_commit", "local_blocked")}
    rows.update(persistent_commit=[], persistent_blocked=[], local_restore=[])
    costs = {f"{r}_{c}": [] for r in ("raw_read", "local_restore") for c in ("cpu_s", "faults")}
    for r in range(rounds):
        shm = tempfile.mkdtemp(dir=SHM, prefix="jaxjob-bench-")
        disk = tempfile.mkdtemp(prefix="jaxjob-bench-")
        try:
            written, read = _raw(arrays, os.path.join(shm, "raw"))
            rows["raw_write"].append(written)
            ckpt = jaxjob.CheckpointManager(
                os.path.join(disk, "ckpt"), local=jaxjob.LocalTier(os.path.join(shm, "local"))
            )
            start = time.perf_counter()
            ckpt.save(0, ws)
            rows["persistent_blocked"].append(time.perf_counter() - start)
            ckpt.wait_until_finished()
            rows["persistent_commit"].append(time.perf_counter() - start)
            start = time.perf_counter()
            ckpt.tier("local").save(1, ws)
            rows["local_blocked"].append(time.perf_counter() - start)
            ckpt.tier("local").finish()
            rows["local_commit"].append(time.perf_counter() - start)
            ckpt.close()
            _reads(read, os.path.join(shm, "local"), reads, rows, costs)
        finally:
            shutil.rmtree(shm, ignore_errors=True)
            shutil.rmtree(disk, ignore_errors=True)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in rows.items()))
    return {k: summary(v) for k, v in rows.items()}, {k: summary(v) for k, v in costs.items()}


def _digits_epoch_s(mode, root, epochs):
    args = [DIGITS, "--epochs", str(epochs), "--ckpt-dir", os.path.join(root, mode)]
    if mode == "none":
        args.append("--no-checkpoint")
    elif mode == "local":
        args += ["--local-dir", os.path.join(SHM, f"jaxjob-bench-digits-{os.getpid()}")]
        args += ["--save-every-epochs", str(epochs)]  # the persistent tier: epoch 0 and the end
    return _digits_run(args)


def _digits_run(args):
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    lines = [x for x in proc.stdout.splitlines() if x.startswith("epoch")]
    times = [float(x.split("time ")[1].split("s")[0]) for x in lines]
    return statistics.median(times[1:])  # the first epoch compiles


def _digits(rounds, epochs):
    found = {m: [] for m in ("none", "local", "persistent")}
    for _ in range(rounds):
        root = tempfile.mkdtemp(prefix="jaxjob-bench-")
        try:
            for mode in found:  # alternating, in fresh processes
                found[mode].append(_digits_epoch_s(mode, root, epochs))
        finally:
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(os.path.join(SHM, f"jaxjob-bench-digits-{os.getpid()}"), True)
    return {m: summary(v) for m, v in found.items()}


def _timeline_child(argv):
    """In a child: a 20-epoch job (~0.25 s epochs); prints each epoch's end and each commit."""
    ckpt_dir, local_dir, mib = argv[0], argv[1], int(argv[2])
    job = jaxjob.Job()
    arrays = workspace_arrays(4, mib * 2**20 // 4)
    job.init_group.add(lambda ws: {"w": {k: jnp.asarray(v) for k, v in arrays.items()}}, jit=False)

    ends = []

    def epoch(ws):
        time.sleep(0.25)  # the epoch's compute
        out = {"w": {k: v + 1 for k, v in ws["w"].items()}}
        jax.block_until_ready(out)
        ends.append(time.time())
        return out

    job.epoch_group.add(epoch, jit=False)
    jaxjob.epoch_limiter(job, 20)
    local = jaxjob.LocalTier(local_dir, keep=None) if local_dir != "-" else None  # every commit
    ckpt = jaxjob.CheckpointManager(ckpt_dir, local=local)
    runner = jaxjob.JobRunner(job, ckpt, save_every_epochs=10)
    start = time.time()
    runner.train(jaxjob.Session())
    ckpt.close()
    commits = {}
    for row in list_tiers(ckpt_dir):
        if row.committed and row.committed_at is not None:
            commits[row.epoch] = min(commits.get(row.epoch, 1e30), row.committed_at)
    print("RESULT " + json.dumps({"start": start, "ends": ends, "commits": commits}))


def _lost_epochs(timeline, draws, seed):
    """Mean epochs run again after a kill at a uniformly random moment of the run."""
    rng = random.Random(seed)
    start, ends = timeline["start"], timeline["ends"]
    commits = sorted((t, int(e)) for e, t in timeline["commits"].items())
    lost = []
    for _ in range(draws):
        t = rng.uniform(start, ends[-1])
        finished = sum(1 for end in ends if end <= t)
        resumed = max([e for c, e in commits if c <= t], default=0)
        lost.append(max(0, finished - resumed))
    return statistics.mean(lost)


def _work_lost(mib, rounds, draws):
    found = {"local_and_persistent": [], "persistent_only": []}
    for r in range(rounds):
        for mode in found:
            root = tempfile.mkdtemp(prefix="jaxjob-bench-")
            shm = tempfile.mkdtemp(dir=SHM, prefix="jaxjob-bench-")
            try:
                local = os.path.join(shm, "local") if mode == "local_and_persistent" else "-"
                argv = [__file__, "--timeline-child", os.path.join(root, "c"), local, str(mib)]
                timeline = result_of(argv, timeout=600)
                found[mode].append(_lost_epochs(timeline, draws, seed=r))
            finally:
                shutil.rmtree(root, ignore_errors=True)
                shutil.rmtree(shm, ignore_errors=True)
    return {m: summary(v) for m, v in found.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="workspace MiB (default 1024)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--reads", type=int, default=3, help="raw reads and restores per round, alternating"
    )
    parser.add_argument("--quick", action="store_true", help="128 MiB, 1 round, short runs")
    parser.add_argument("--timeline-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.timeline_child:
        _timeline_child(args.timeline_child)
        return
    mib, rounds = (128, 1) if args.quick else (args.mib, args.rounds)
    saves, reads = _saves(mib, rounds, args.reads)
    digits = _digits(rounds, 6 if args.quick else 12)
    lost = _work_lost(min(mib, 64), rounds, 2000)
    med = {k: v["median"] for k, v in saves.items()}
    figures = {
        "local_commit_over_raw_write_fsync": med["local_commit"] / med["raw_write"],
        "local_blocked_over_local_commit": med["local_blocked"] / med["local_commit"],
        "local_blocked_over_persistent_blocked": med["local_blocked"] / med["persistent_blocked"],
        "local_restore_over_raw_read": med["local_restore"] / med["raw_read"],
        "local_restore_cpu_over_raw_read_cpu": reads["local_restore_cpu_s"]["median"]
        / reads["raw_read_cpu_s"]["median"],
        "digits_epoch_local_over_none": digits["local"]["median"] / digits["none"]["median"],
        "digits_epoch_persistent_over_none": digits["persistent"]["median"]
        / digits["none"]["median"],
        "epochs_lost_two_tiers_over_persistent_only": lost["local_and_persistent"]["median"]
        / lost["persistent_only"]["median"],
    }
    print(json.dumps({"mib": mib, "rounds": rounds, "reads": args.reads, "saves_s": saves,
                      "read_costs": reads, "digits_epoch_s": digits, "epochs_lost": lost},
                     indent=1))  # fmt: skip
    for name, value in figures.items():
        print(f"{name:48s} {value:.3f}")
    print("RESULT " + json.dumps(figures))


if __name__ == "__main__":
    main()
