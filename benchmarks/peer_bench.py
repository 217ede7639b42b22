"""One round of issue 37's rows in a fresh process: jaxjob beside its peers on the same arrays.

    python benchmarks/peer_bench.py '{"mode": "save", "sizes": {"many": [1000, 134216]},
                                      "saves": 5, "order": 0, "dir": "/tmp/x"}'

``mode``:

* ``save``: at each size of ``sizes`` (``{label: [leaves, leaf_bytes]}``), jaxjob's
  ``CheckpointManager``, Orbax's (defaults), the minimal writer and raw1 each save the
  same JAX arrays ``saves`` times after a first save of their own (timed apart: the
  later ones are a training loop's steady state): per save, the time the caller is
  blocked, the time to a durable commit and the process's CPU time (all threads);
  then jaxjob's and Orbax's full and partial (a quarter of the leaves) restores of
  the last save.
* ``tiny``: jaxjob, safetensors + fsync, raw1 and the minimal writer commit the same
  small arrays ``saves`` times (``first``: the first save of each); then jaxjob's full
  restore and safetensors' load, ``restores`` times each. Each timed save is framed
  by ``access("/jaxjob-bench-mark/...")`` calls, so that ``strace`` output can be cut
  into saves (``run`` counts the fsyncs that way).
* ``restore``: jaxjob, Orbax and safetensors save the same arrays (kept under ``dir``
  for ``rss``), then each restores them in full from the page cache; ``torch.load``
  too where torch is installed.
* ``rss``: in this fresh process, the peak RSS of one full restore (``method``
  ``jaxjob``, ``jaxjob-budget`` under ``max_host_bytes`` = the workspace /
  ``peer_table.BUDGET_PART`` (4), or
  ``orbax``) of what ``restore`` saved under ``dir``, less the RSS before it, over
  the workspace's bytes; ``jaxjob-save-budget``: the same of a save under that budget.

Methods run in an order rotated by ``order``. Prints one ``RESULT {json}`` line.
"""

import gc
import json
import os
import resource
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import peers  # noqa: E402
from common import (  # noqa: E402
    cpu_seconds,
    peak_rss,
    reset_peak_rss,
    rss,
    timed,
    workspace_arrays,
)
from peer_table import BUDGET_PART  # noqa: E402

import jaxjob  # noqa: E402


def _mark(what):
    """A system call ``strace`` shows (``access`` of a path that does not exist)."""
    os.access(f"/jaxjob-bench-mark/{what}", os.F_OK)


def _rotated(names, order):
    shift = order % len(names)
    return names[shift:] + names[:shift]


# ---- savers: start(step) returns once the caller may go on; finish() waits for the commit ----


class _Jaxjob:
    def __init__(self, ws, root):
        self.ws, self.manager = ws, jaxjob.CheckpointManager(root)

    def start(self, step):
        self.manager.save(step, self.ws)

    def finish(self):
        self.manager.wait_until_finished()

    def close(self):
        self.manager.close()


class _Orbax:
    def __init__(self, ws, root):
        import orbax.checkpoint as ocp

        self.ws, self.ocp, self.manager = ws, ocp, ocp.CheckpointManager(root)

    def start(self, step):
        self.manager.save(step, args=self.ocp.args.StandardSave(self.ws))

    def finish(self):
        self.manager.wait_until_finished()

    def close(self):
        self.manager.close()


class _Minimal:
    def __init__(self, ws, root):
        self.ws, self.writer = ws, peers.MinimalWriter(root)

    def start(self, step):
        self.writer.save(step, self.ws)

    def finish(self):
        self.writer.wait()

    def close(self):
        self.writer.wait()


class _Sync:
    """A synchronous save, ``fn(ws, path)``: blocked until it is durable."""

    def __init__(self, fn, ws, root):
        self.fn, self.ws, self.root = fn, ws, root
        os.makedirs(root, exist_ok=True)

    def start(self, step):
        self.fn(self.ws, os.path.join(self.root, str(step)))

    def finish(self):
        pass

    def close(self):
        pass


SAVERS = {
    "jaxjob": _Jaxjob,
    "orbax": _Orbax,
    "minimal": _Minimal,
    "raw1": lambda ws, root: _Sync(peers.raw1_save, ws, root),
    "safetensors": lambda ws, root: _Sync(peers.safetensors_save, ws, root),
}


def _one_save(saver, step, label):
    _mark(f"{label}/{step}/start")
    cpu0, start = cpu_seconds(), time.perf_counter()
    saver.start(step)
    blocked = time.perf_counter() - start
    saver.finish()
    commit = time.perf_counter() - start
    cpu = cpu_seconds() - cpu0
    _mark(f"{label}/{step}/end")
    return blocked, commit, cpu


def _saves(method, ws, root, saves):
    """{"first": [...], "blocked": [...], "commit": [...], "cpu": [...]} of one method."""
    saver = SAVERS[method](ws, root)
    try:
        first = _one_save(saver, 0, f"{method}-first")
        later = [_one_save(saver, step, method) for step in range(1, saves + 1)]
    finally:
        saver.close()
    return {
        "first_commit": [first[1]],
        "blocked": [b for b, _, _ in later],
        "commit": [c for _, c, _ in later],
        "cpu": [u for _, _, u in later],
    }


def _block(tree):
    return jax.block_until_ready(tree)


def _jaxjob_restores(root, step, names):
    full = timed(lambda: _block(jaxjob.restore(root, epoch=step)))[0]
    part = timed(lambda: _block(jaxjob.restore(root, epoch=step, leaves=names)))[0]
    return {"restore": [full], "restore_part": [part]}


def _orbax_restore(path, ws, names=None):
    """Orbax's restore of ``path`` (a step's ``default`` item): all leaves, or ``names`` only."""
    import orbax.checkpoint as ocp

    keep = ws if names is None else {k: ws[k] for k in names}
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, keep)
    args = ocp.args.PyTreeRestore(
        item=abstract,
        restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
        partial_restore=names is not None,
    )
    with ocp.PyTreeCheckpointer() as checkpointer:
        return _block(checkpointer.restore(path, args=args))


def _orbax_restores(root, step, ws, names):
    path = os.path.join(root, str(step), "default")
    full = timed(_orbax_restore, path, ws)[0]
    part = timed(_orbax_restore, path, ws, names)[0]
    return {"restore": [full], "restore_part": [part]}


def _jax_workspace(spec):
    host = workspace_arrays(spec["leaves"], spec["leaf_bytes"])
    return _block({k: jax.device_put(v) for k, v in host.items()})


def _save_round(spec, leaves, leaf_bytes):
    ws = _jax_workspace({"leaves": leaves, "leaf_bytes": leaf_bytes})
    names = sorted(ws)[: max(1, len(ws) // 4)]
    result = {}
    for method in _rotated(["jaxjob", "orbax", "minimal", "raw1"], spec.get("order", 0)):
        root = os.path.join(spec["dir"], method)
        result[method] = _saves(method, ws, root, spec["saves"])
        if method == "jaxjob":
            result[method] |= _jaxjob_restores(root, spec["saves"], names)
        if method == "orbax":
            result[method] |= _orbax_restores(root, spec["saves"], ws, names)
        shutil.rmtree(root, ignore_errors=True)
    return result


def save_mode(spec):
    """{size label: {method: figures}}, the sizes in ``spec["sizes"]``'s order."""
    return {label: _save_round(spec, *size) for label, size in spec["sizes"].items()}


def _tiny_restores(method, root, ws, saves, repeats):
    if method == "jaxjob":
        once = lambda: _block(jaxjob.restore(root, epoch=saves))  # noqa: E731
    elif method == "safetensors":
        once = lambda: peers.safetensors_load(os.path.join(root, str(saves)))  # noqa: E731
    elif method == "raw1":
        once = lambda: peers.raw1_load(os.path.join(root, str(saves)), ws)  # noqa: E731
    else:
        once = lambda: _block(jax.device_put(peers.MinimalWriter(root).load(saves, ws)))  # noqa: E731
    once()  # the first restore of a process builds what later ones reuse
    return [timed(once)[0] for _ in range(repeats)]


def tiny_mode(spec):
    ws = _jax_workspace(spec)
    result = {}
    for method in _rotated(["jaxjob", "safetensors", "raw1", "minimal"], spec.get("order", 0)):
        root = os.path.join(spec["dir"], method)
        result[method] = _saves(method, ws, root, spec["saves"])
        result[method]["restore"] = _tiny_restores(
            method, root, ws, spec["saves"], spec["restores"]
        )
        shutil.rmtree(root, ignore_errors=True)
    return result


def restore_mode(spec):
    ws = _jax_workspace(spec)
    abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in ws.items()}
    path = {m: os.path.join(spec["dir"], m) for m in ("jaxjob", "orbax", "safetensors", "torch")}
    _saves("jaxjob", ws, path["jaxjob"], 0)
    _saves("orbax", ws, path["orbax"], 0)
    host = peers.host_copy(ws)
    peers.safetensors_save(host, path["safetensors"])
    loads = {
        "jaxjob": lambda: _block(jaxjob.restore(path["jaxjob"], epoch=0)),
        "orbax": lambda: _orbax_restore(os.path.join(path["orbax"], "0", "default"), abstract),
        "safetensors": lambda: peers.safetensors_load(path["safetensors"]),
    }
    if _has("torch"):
        loads["torch"] = _torch_round(host, path["torch"])
    del ws, host  # the restores start from the same memory as a fresh process's
    gc.collect()
    return {m: {"restore": [timed(loads[m])[0]]} for m in _rotated(list(loads), spec["order"])}


def _has(module):
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def _torch_round(host, path):
    """Saves ``host`` with ``torch.save``; the ``torch.load`` (weights only) to time."""
    import torch

    torch.save({k: torch.from_numpy(v) for k, v in host.items()}, path)
    return lambda: torch.load(path, weights_only=True)


def rss_mode(spec):
    ws_bytes = spec["leaves"] * spec["leaf_bytes"]
    budget = ws_bytes // BUDGET_PART if spec["method"].endswith("-budget") else None
    if spec["method"] == "jaxjob-save-budget":
        return _save_rss(spec, budget)
    shape = (spec["leaf_bytes"] // 4,)  # workspace_arrays' float32 leaves
    ws_like = {f"l{i:03d}": jax.ShapeDtypeStruct(shape, np.float32) for i in range(spec["leaves"])}
    if spec["method"].startswith("jaxjob"):
        root = os.path.join(spec["dir"], "jaxjob")
        # imports what a restore needs
        _block(jaxjob.restore(root, epoch=0, leaves=["l000"], max_host_bytes=budget))
        restore = lambda: _block(jaxjob.restore(root, epoch=0, max_host_bytes=budget))  # noqa: E731
    else:
        path = os.path.join(spec["dir"], spec["method"], "0", "default")
        _orbax_restore(path, ws_like, ["l000"])
        restore = lambda: _orbax_restore(path, ws_like)  # noqa: E731
    return _peak_of(restore, ws_bytes)


def _peak_of(run, ws_bytes):
    """Peak RSS growth of ``run()`` over the RSS before it, over ``ws_bytes``."""
    gc.collect()
    start = rss()
    reset_peak_rss()
    out = run()
    peak = peak_rss()
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    del out
    return {"peak_x": (peak - start) / ws_bytes, "ru_maxrss_x": (max_rss - start) / ws_bytes}


def _save_rss(spec, budget):
    """A save's peak RSS under ``max_host_bytes=budget``, beside the workspace it saves."""
    ws = _jax_workspace(spec)
    ckpt = jaxjob.CheckpointManager(os.path.join(spec["dir"], "save-budget"), max_host_bytes=budget)
    ckpt.save(0, {"l000": ws["l000"]})  # imports what a save needs
    ckpt.wait_until_finished()

    def save():
        ckpt.save(1, ws)
        ckpt.wait_until_finished()

    # growth over the RSS with the workspace held: 1 + peak_x is the save's peak over it
    return _peak_of(save, spec["leaves"] * spec["leaf_bytes"])


MODES = {"save": save_mode, "tiny": tiny_mode, "restore": restore_mode, "rss": rss_mode}


def main():
    spec = json.loads(sys.argv[1])
    result = MODES[spec["mode"]](spec)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
