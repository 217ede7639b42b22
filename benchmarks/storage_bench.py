"""One round of the storage benchmark in a fresh process: every method on the same arrays.

    python benchmarks/storage_bench.py '{"leaves": 4, "leaf_bytes": 268435456, "dir": "/tmp/x",
                                         "mode": "time", "order": 0}'

``mode`` ``time``: each method saves then restores the same arrays, methods in an
order rotated by ``order`` (``methods``: only those; ``later_saves``: that many more
jaxjob saves on the same manager, the steady state of a loop); ``rss-save`` /
``rss-restore``: peak RSS of one jaxjob save or restore, as a multiple of the
workspace. Prints one ``RESULT {json}`` line.
"""

import gc
import json
import os
import shutil
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from common import (  # noqa: E402
    bytes_read,
    fsync_path,
    fsync_tree,
    peak_rss,
    reset_peak_rss,
    rss,
    timed,
    workspace_arrays,
)

import jaxjob  # noqa: E402


def _block(tree):
    return jax.block_until_ready(tree)


# ---- the limits ------------------------------------------------------------------------------


def limits(host, root):
    """write+fsync, page-cache read and memcpy of the same bytes."""
    os.makedirs(root)

    def write():
        for name, array in host.items():
            path = os.path.join(root, name)
            with open(path, "wb") as f:
                f.write(memoryview(array).cast("B"))
                f.flush()
                os.fsync(f.fileno())
        fsync_path(root)

    def read():
        out = {}
        for name, array in host.items():
            out[name] = np.empty_like(array)
            with open(os.path.join(root, name), "rb", buffering=0) as f:
                f.readinto(memoryview(out[name]).cast("B"))
        return out

    result = {"write_fsync": timed(write)[0], "page_cache_read": timed(read)[0]}
    result["memcpy"] = timed(lambda: {k: v.copy() for k, v in host.items()})[0]
    return result


# ---- jaxjob ------------------------------------------------------------------------------------


def _timed_save(ckpt, epoch, ws):
    """(blocked, to commit) seconds of one save."""
    blocked, _ = timed(ckpt.save, epoch, ws)
    waited, _ = timed(ckpt.wait_until_finished)
    return blocked, blocked + waited


def jaxjob_rounds(ws, root, partial_names, later_saves=0):
    """Blocked time, time to a durable commit, full and partial restores with bytes read.

    The first save is a new manager's (it takes the lock and builds Orbax's
    checkpointer); ``later_saves`` more saves of the same manager give the
    steady state of a training loop (``*_later``: their medians).
    """
    warm = jaxjob.CheckpointManager(root + "-warm-up")  # a process's first save costs more
    warm.save(0, ws)
    warm.close()
    shutil.rmtree(root + "-warm-up")
    ckpt = jaxjob.CheckpointManager(root)
    blocked, commit = _timed_save(ckpt, 0, ws)
    result = {"blocked": blocked, "commit": commit}
    if later_saves:
        later = [_timed_save(ckpt, epoch, ws) for epoch in range(1, later_saves + 1)]
        result["blocked_later"] = statistics.median(b for b, _ in later)
        result["commit_later"] = statistics.median(c for _, c in later)
    ckpt.close()
    before = bytes_read()
    result["restore"] = timed(lambda: _block(jaxjob.restore(root, epoch=0)))[0]
    result["restore_bytes"] = bytes_read() - before
    for label, names in partial_names.items():
        before = bytes_read()
        result[f"restore_{label}"] = timed(
            lambda n=names: _block(jaxjob.restore(root, epoch=0, leaves=n))
        )[0]
        result[f"restore_{label}_bytes"] = bytes_read() - before
    return result


def orbax_default(ws, root):
    """Orbax's CheckpointManager with default options: async save to commit, full restore."""
    import orbax.checkpoint as ocp

    warm = ocp.CheckpointManager(root + "-warm-up")  # a process's first save costs more
    warm.save(0, args=ocp.args.StandardSave(ws))
    warm.close()
    shutil.rmtree(root + "-warm-up")
    manager = ocp.CheckpointManager(root)
    save, _ = timed(
        lambda: (manager.save(0, args=ocp.args.StandardSave(ws)), manager.wait_until_finished())
    )
    manager.close()
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, ws)
    manager = ocp.CheckpointManager(root)
    restore, _ = timed(lambda: _block(manager.restore(0, args=ocp.args.StandardRestore(abstract))))
    manager.close()
    return {"commit": save, "restore": restore}


def torch_rounds(host, root):
    """torch.save (fsynced) and torch.load (weights_only) of the same arrays."""
    import torch

    os.makedirs(root)
    path = os.path.join(root, "model.pt")
    tensors = {k: torch.from_numpy(v) for k, v in host.items()}

    def save():
        torch.save(tensors, path)
        fsync_path(path)
        fsync_path(root)

    return {
        "commit": timed(save)[0],
        "restore": timed(lambda: torch.load(path, weights_only=True))[0],
    }


def safetensors_rounds(host, root):
    """safetensors.numpy save_file (fsynced) and load_file."""
    from safetensors.numpy import load_file, save_file

    os.makedirs(root)
    path = os.path.join(root, "model.safetensors")

    def save():
        save_file(host, path)
        fsync_path(path)
        fsync_path(root)

    return {"commit": timed(save)[0], "restore": timed(lambda: load_file(path))[0]}


def numpy_rounds(host, root):
    """np.save of each array (fsynced) and np.load."""
    os.makedirs(root)

    def save():
        for name, array in host.items():
            np.save(os.path.join(root, name + ".npy"), array)
        fsync_tree(root)

    def load():
        return {name: np.load(os.path.join(root, name + ".npy")) for name in host}

    return {"commit": timed(save)[0], "restore": timed(load)[0]}


# ---- one child ----------------------------------------------------------------------------------


def _time_mode(spec, host, ws):
    names = sorted(host)
    partial = {"quarter": names[: max(1, len(names) // 4)], "one": names[:1]}
    methods = {
        "limits": lambda d: limits(host, d),
        "jaxjob": lambda d: jaxjob_rounds(ws, d, partial, spec.get("later_saves", 0)),
        "orbax": lambda d: orbax_default(ws, d),
        "torch": lambda d: torch_rounds(host, d),
        "safetensors": lambda d: safetensors_rounds(host, d),
        "numpy": lambda d: numpy_rounds(host, d),
    }
    order = [m for m in methods if m in spec.get("methods", methods)]
    shift = spec.get("order", 0) % len(order)
    order = order[shift:] + order[:shift]
    result = {}
    for name in order:
        directory = os.path.join(spec["dir"], name)
        result[name] = methods[name](directory)
        shutil.rmtree(directory, ignore_errors=True)
    return result


def _rss_mode(spec, ws_bytes):
    root = os.path.join(spec["dir"], "rss")
    if spec["mode"] == "rss-restore":
        _block(jaxjob.restore(root, leaves=["l000"]))  # compile and import what a restore needs
        gc.collect()
        start = rss()
        reset_peak_rss()
        _block(jaxjob.restore(root))
        return {"peak_x": (peak_rss() - start) / ws_bytes}
    start = rss()
    ws = {
        k: jax.device_put(v)
        for k, v in workspace_arrays(spec["leaves"], spec["leaf_bytes"]).items()
    }
    _block(ws)
    # The NumPy source arrays stay alive (in a reference cycle) until a collection: before
    # this, the peak counted them as 1x of "save" memory the save never used.
    gc.collect()
    reset_peak_rss()  # the NumPy source arrays are gone: only the workspace remains
    ckpt = jaxjob.CheckpointManager(root)
    ckpt.save(0, ws)
    ckpt.wait_until_finished()
    ckpt.close()
    return {"peak_x": (peak_rss() - start) / ws_bytes}


def main():
    spec = json.loads(sys.argv[1])
    ws_bytes = spec["leaves"] * spec["leaf_bytes"]
    if spec["mode"].startswith("rss"):
        result = _rss_mode(spec, ws_bytes)
    else:
        host = workspace_arrays(spec["leaves"], spec["leaf_bytes"])
        ws = {k: jax.device_put(v) for k, v in host.items()}
        _block(ws)
        result = _time_mode(spec, host, ws)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
