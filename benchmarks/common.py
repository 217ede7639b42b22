"""Helpers shared by the benchmarks: workspaces, clocks, peak RSS and bytes read of this process."""

import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np


def workspace_arrays(leaves, leaf_bytes, seed=0):
    """``leaves`` float32 NumPy arrays of ``leaf_bytes`` each, random (so nothing compresses)."""
    rng = np.random.default_rng(seed)
    n = leaf_bytes // 4
    return {f"l{i:03d}": rng.standard_normal(n, dtype=np.float32) for i in range(leaves)}


def result_of(argv, timeout):
    """Runs ``python ARGV`` in a fresh process; the JSON of its ``RESULT`` line."""
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{' '.join(map(str, argv))} failed:\n{proc.stderr[-3000:]}")


def timed(fn, *args, **kwargs):
    """(seconds, result) of one call."""
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - start, result


def cpu_seconds():
    """This process's CPU time so far, every thread's (user + system), in seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def count_compiles():
    """A list that grows by one per XLA compilation in this process (its seconds)."""
    import jax

    compiles = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    return compiles


def drop_epoch(directory, epoch):
    """Removes what a resumed run saved for ``epoch`` under ``directory``, so the next resumes
    from the epoch before: Orbax's step directory ``<epoch>``; jaxjob's ``<node>.<epoch>`` and
    the lines about it in ``jaxjob_metadata.jsonl`` and its epoch records
    (``.jaxjob/history/<node>.jsonl``)."""
    for name in os.listdir(directory):
        if name == str(epoch) or name.endswith(f".{epoch}"):
            shutil.rmtree(os.path.join(directory, name))
    history = os.path.join(directory, ".jaxjob", "history")
    names = os.listdir(history) if os.path.isdir(history) else []
    for path in [os.path.join(directory, "jaxjob_metadata.jsonl")] + [
        os.path.join(history, name) for name in names if name.endswith(".jsonl")
    ]:
        if os.path.exists(path):
            with open(path) as f:
                kept = [line for line in f if _epoch_of(json.loads(line)) != epoch]
            with open(path, "w") as f:
                f.writelines(kept)


def _epoch_of(line):
    """The epoch a metadata or history line is about (None: none)."""
    return line.get("epoch", line.get("record", {}).get("epoch"))


def summary(values):
    """Median, min and max of a list of numbers (a dict; None for an empty list)."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _status(field):
    with open("/proc/self/status") as f:
        text = f.read()
    return int(re.search(rf"{field}:\s+(\d+)", text).group(1)) * 1024


def rss():
    """This process's resident set size, in bytes."""
    return _status("VmRSS")


def reset_peak_rss():
    """Resets this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss():
    """This process's peak RSS since start or the last :func:`reset_peak_rss`, in bytes."""
    return _status("VmHWM")


def bytes_read():
    """Bytes this process has passed through read system calls (``rchar`` of /proc/self/io)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


def fsync_path(path):
    """fsyncs a file or directory."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root):
    """fsyncs every file and directory under ``root``, then ``root`` and its parent."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            fsync_path(os.path.join(dirpath, name))
        fsync_path(dirpath)
    fsync_path(os.path.dirname(os.path.abspath(root)))
