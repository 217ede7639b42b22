"""The transformer's training loop saving every epoch, through jaxjob and through its peers.

    python benchmarks/peer_loop.py '{"methods": ["minimal"], "epochs": 10, "steps": 4,
                                     "skip": 2, "dir": "/tmp/x"}'

The 6.8M-parameter transformer of ``restart.py`` (parameters and Adam state, 56
leaves, 82 MiB) trains ``epochs`` epochs of ``steps`` steps, each epoch one jitted
program, in a hand-written loop that saves the state after every epoch through
``method``: ``plain`` (no save), ``jaxjob`` (a ``CheckpointManager``), ``orbax``
(Orbax's ``CheckpointManager``, defaults) or ``minimal`` (``peers.MinimalWriter``).
The writes overlap the next epoch, as in training. Per epoch after the first
``skip`` (compilation): its wall time (compute, plus the save's blocked part and
whatever the background write takes from the compute), the process's CPU time (all
threads) and the save's blocked time. ``methods`` run one after the other in this
process (``run.py`` gives each its own process but in ``--quick``, which also sets
``dim``: a smaller model with the same leaves). Prints one ``RESULT {json}`` line.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import peers  # noqa: E402
import restart  # noqa: E402
from common import cpu_seconds  # noqa: E402

import jaxjob  # noqa: E402


def _saver(method, root):
    """(save(epoch, ws), finish()) of one method."""
    if method == "plain":
        return (lambda epoch, ws: None), (lambda: None)
    if method == "jaxjob":
        manager = jaxjob.CheckpointManager(root)
        return manager.save, lambda: (manager.wait_until_finished(), manager.close())
    if method == "orbax":
        import orbax.checkpoint as ocp

        manager = ocp.CheckpointManager(root)
        return (
            lambda epoch, ws: manager.save(epoch, args=ocp.args.StandardSave(ws)),
            lambda: (manager.wait_until_finished(), manager.close()),
        )
    writer = peers.MinimalWriter(root)
    return (lambda epoch, ws: writer.save(epoch, _flat(ws))), writer.wait


def _flat(ws):
    """The workspace as ``{key path: leaf}`` (the minimal writer's file names)."""
    leaves = jax.tree_util.tree_leaves_with_path(ws)
    return {jax.tree_util.keystr(path).replace("/", "_"): leaf for path, leaf in leaves}


def run(method, spec, epoch_fn, ws):
    """{"epoch_s", "cpu_s", "blocked_s"}: one list each, the epochs after ``skip``."""
    save, finish = _saver(method, os.path.join(spec["dir"], method))
    out = {"epoch_s": [], "cpu_s": [], "blocked_s": []}
    for epoch in range(spec["epochs"]):
        cpu0, start = cpu_seconds(), time.perf_counter()
        ws = epoch_fn(ws)
        jax.block_until_ready(ws)
        saved = time.perf_counter()
        save(epoch, ws)
        end = time.perf_counter()
        if epoch >= spec["skip"]:
            out["epoch_s"].append(end - start)
            out["cpu_s"].append(cpu_seconds() - cpu0)
            out["blocked_s"].append(end - saved)
    finish()
    return out


def main():
    spec = json.loads(sys.argv[1])
    if spec.get("dim"):  # --quick: the same 56 leaves, smaller (model() reads these globals)
        restart.DIM, restart.SEQ = spec["dim"], spec["dim"] // 2
    init, step, batch = restart.model()
    steps = spec["steps"]

    @jax.jit
    def epoch_fn(ws):  # restart.transformer_job's epoch, as one program
        params, opt = ws["params"], ws["opt"]
        for i in range(steps):
            params, opt, _ = step(params, opt, batch(ws["epoch"], i))
        return {"params": params, "opt": opt, "epoch": ws["epoch"] + 1}

    params, opt = init()
    ws = {"params": params, "opt": opt, "epoch": jax.numpy.zeros((), "int32")}
    result = {method: run(method, spec, epoch_fn, ws) for method in spec["methods"]}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
