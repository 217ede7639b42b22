"""CPU time of a save: the transformer's workspace, per thread group, against a raw write.

    python benchmarks/save_cpu.py DIR --saves 10

Saves the workspace of ``restart.py``'s 6.8M-parameter transformer (parameters
and Adam state, 56 leaves, 82 MiB) ``--saves`` times with a ``CheckpointManager``,
each to its commit, and reads each thread's user and system CPU time from
``/proc/self/task`` before, during and after (threads that end are sampled every
5 ms, by a thread whose own CPU time is left out). TensorStore's threads are
``ts_pool_worker``; Python's (the training thread, Orbax's and jaxjob's) are
``python``. The reference: a plain ``write`` of the same bytes to a new file in
DIR, in the same process. On 2 cores this CPU time is what a background save
takes from XLA's compute threads (``step_slowdown.py``). Prints one ``RESULT
{json}`` line: CPU seconds per save by group, per raw write, and their ratio.
"""

import argparse
import collections
import json
import os
import shutil
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

_TICK = os.sysconf("SC_CLK_TCK")


def _threads():
    """tid -> (group, user s, system s) for this process's threads now."""
    found = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                group = f.read().strip().rstrip("0123456789_")
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        found[tid] = (group, int(fields[11]) / _TICK, int(fields[12]) / _TICK)
    return found


def _cpu_by_group(work):
    """Runs ``work()``; {group: [user s, system s]} its threads used (not the sampler's own)."""
    before, last, done, me = _threads(), {}, threading.Event(), []

    def sample():
        me.append(str(threading.get_native_id()))
        while not done.is_set():
            last.update(_threads())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    work()
    done.set()
    sampler.join()
    last.update(_threads())
    used = collections.defaultdict(lambda: [0.0, 0.0])
    for tid, (group, user, system) in last.items():
        if tid in me:  # reading /proc every 5 ms costs more than a raw write
            continue
        _, user0, system0 = before.get(tid, (group, 0.0, 0.0))
        used[group][0] += user - user0
        used[group][1] += system - system0
    return dict(used)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--saves", type=int, default=10)
    args = parser.parse_args()
    import jax
    import numpy as np
    import restart

    import jaxjob

    init, _, _ = restart.model()
    params, opt = init()
    ws = {"params": params, "opt": opt, "epoch": jax.numpy.zeros((), "int32")}
    nbytes = sum(x.nbytes for x in jax.tree.leaves(ws))
    root = os.path.join(args.dir, "ckpt")
    ckpt = jaxjob.CheckpointManager(root)
    ckpt.save(0, ws)  # the first save makes the lock and Orbax's checkpointer
    ckpt.wait_until_finished()

    def saves():
        for epoch in range(1, args.saves + 1):
            ckpt.save(epoch, ws)
            ckpt.wait_until_finished()

    used = _cpu_by_group(saves)
    ckpt.close()
    data = np.random.default_rng(0).bytes(nbytes)

    def writes():
        for i in range(args.saves):
            with open(os.path.join(args.dir, f"raw{i}"), "wb") as f:
                f.write(data)

    raw = _cpu_by_group(writes)
    shutil.rmtree(args.dir, ignore_errors=True)
    n = args.saves
    per_save = {g: [round(u / n, 4), round(s / n, 4)] for g, (u, s) in used.items()}
    save_s = sum(u + s for u, s in used.values()) / args.saves
    write_s = sum(u + s for u, s in raw.values()) / args.saves
    result = {
        "leaves": len(jax.tree.leaves(ws)),
        "mib": nbytes / 2**20,
        "per_save_user_sys": {g: v for g, v in per_save.items() if sum(v) > 0},
        "save_cpu_s": save_s,
        "raw_write_cpu_s": write_s,
        "ratio": save_s / write_s if write_s else None,
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
