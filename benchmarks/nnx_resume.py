"""NNX resume cost: the flax NNX transformer's one-epoch resume, jaxjob against plain Orbax.

    python benchmarks/nnx_resume.py DIR --rounds 3

The decoder-only transformer of ``examples/nnx_lm.py`` (its model, data, AdamW and
training epoch, imported from it) is trained for ``--epochs`` epochs (default 2) of
``--steps`` steps (default the example's 20), once by the example's ``jaxjob`` job
with one (durable) tier and once by a hand-written loop on Orbax's
``CheckpointManager`` that saves ``nnx.state`` of the model and the optimizer state
every epoch. Then, alternating, fresh processes resume each and run exactly one more
epoch: jaxjob's job with one more epoch allowed, the Orbax loop restoring the newest
step into the abstract state of a freshly built model (``nnx.eval_shape``,
``jax.eval_shape``). The clock starts after the imports (jaxjob's lazy ones, Orbax among
them, included) and stops when that epoch's
results are ready; the epoch it wrote is then removed, so every round resumes from the
same epoch. Each process also counts its XLA compilations (JAX's ``backend_compile``
events) and notes when it had decided where to resume and when the restore was done.
Prints one ``RESULT {json}`` line: medians, min-max, the ratio jaxjob / Orbax and the
number of leaves each saves.
"""

import argparse
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

from common import count_compiles, drop_epoch, result_of, summary  # noqa: E402


def _example(steps):
    """The ``nnx_lm`` example as a module, with ``steps`` training steps per epoch."""
    import nnx_lm

    nnx_lm.STEPS = steps  # read when the epoch is traced, by its job and by the Orbax loop
    return nnx_lm


def _log_times(start, marks):
    """Seconds since ``start`` of jaxjob's first log record that holds each of ``marks``."""
    import logging

    times = {}

    class Marks(logging.Handler):
        def emit(self, record):
            for key, prefix in marks.items():
                if key not in times and prefix in str(record.msg):
                    times[key] = time.perf_counter() - start

    logger = logging.getLogger("jaxjob")
    logger.setLevel(logging.DEBUG)  # "Starting epoch" is a DEBUG record
    logger.propagate = False  # none of them printed: the handler only notes the time
    logger.addHandler(Marks())
    return times


def run_jaxjob(directory, epochs, steps):
    """Trains (or resumes) the example's job to ``epochs``: (seconds to the end of the
    first epoch run, the durations of the compiles by then, the number of compiles in all,
    phases, leaves of the workspace)."""
    import jax

    import jaxjob

    jaxjob.JobRunner, jaxjob.CheckpointManager  # noqa: B018 (jaxjob imports these, and Orbax, lazily)
    nnx_lm = _example(steps)
    compiles = count_compiles()
    start = time.perf_counter()
    phases = _log_times(start, {"decided_s": "Resuming from epoch", "restored_s": "Starting epoch"})
    done = {}

    def epoch_ready(ws):
        if "s" not in done:
            jax.block_until_ready((ws["params"], ws["opt_state"], ws["loss"]))
            done["s"] = time.perf_counter() - start
            done["compiles"] = list(compiles)
            done["leaves"] = len(jax.tree.leaves(dict(ws)))
        return {}

    job = nnx_lm.build_job(nnx_lm.tokenize(nnx_lm.corpus()), epochs)
    job.epoch_group.add(epoch_ready, jit=False)
    runner = jaxjob.JobRunner(job, jaxjob.CheckpointManager(directory))
    runner.train(jaxjob.Session())
    return done["s"], done["compiles"], len(compiles), phases, done["leaves"]


def run_orbax(directory, epochs, steps):
    """The hand-written loop: restore the newest step (or init), then epochs up to ``epochs``,
    each saved; the same numbers as :func:`run_jaxjob`."""
    import jax
    import jax.numpy as jnp
    import optax
    import orbax.checkpoint as ocp
    from flax import nnx

    nnx_lm = _example(steps)
    compiles = count_compiles()
    start = time.perf_counter()
    phases = {}
    tokens = nnx_lm.tokenize(nnx_lm.corpus())
    graphdef, abstract_params = nnx.split(nnx.eval_shape(lambda: nnx_lm.make_model(tokens.vocab)))
    train = jnp.asarray(tokens.train)

    def epoch_fn(params, opt_state, rng_data):  # the example's train_epoch
        rng, key = jax.random.split(jax.random.wrap_key_data(rng_data))
        starts = jax.random.randint(
            key, (nnx_lm.STEPS, nnx_lm.BATCH), 0, len(train) - nnx_lm.SEQ - 1
        )

        def step(carry, batch):
            params, opt_state = carry
            loss, grads = jax.value_and_grad(nnx_lm.loss_fn, argnums=1)(graphdef, params, batch)
            updates, opt_state = nnx_lm.tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        carry = (params, opt_state)
        (params, opt_state), losses = jax.lax.scan(step, carry, nnx_lm.windows(train, starts))
        return params, opt_state, jax.random.key_data(rng), losses.mean()

    def init():
        params = nnx.state(nnx_lm.make_model(tokens.vocab))
        rng = jax.random.key_data(jax.random.key(1))
        return {"params": params, "opt_state": nnx_lm.tx.init(params), "rng": rng}

    manager = ocp.CheckpointManager(os.path.abspath(directory))
    latest = manager.latest_step()
    phases["decided_s"] = time.perf_counter() - start
    if latest is None:
        state, first = init(), 0
    else:
        abstract = {
            "params": abstract_params,
            "opt_state": jax.eval_shape(nnx_lm.tx.init, abstract_params),
            "rng": jax.eval_shape(lambda: jax.random.key_data(jax.random.key(1))),
        }
        state = manager.restore(latest, args=ocp.args.StandardRestore(abstract))
        first = latest
    phases["restored_s"] = time.perf_counter() - start
    leaves = len(jax.tree.leaves(state))
    run_epoch = jax.jit(epoch_fn, donate_argnums=(0, 1))
    seconds = ready = None
    for epoch in range(first, epochs):
        params, opt_state, rng, loss = run_epoch(state["params"], state["opt_state"], state["rng"])
        state = {"params": params, "opt_state": opt_state, "rng": rng}
        if seconds is None:
            jax.block_until_ready((state, loss))
            seconds = time.perf_counter() - start
            ready = list(compiles)
        manager.save(epoch + 1, args=ocp.args.StandardSave(state))
    manager.wait_until_finished()
    manager.close()
    return seconds, ready, len(compiles), phases, leaves


def child_main(args):
    fn = run_jaxjob if args.child == "jaxjob" else run_orbax
    seconds, ready, total, phases, leaves = fn(args.dir, args.epochs, args.steps)
    result = {"seconds": seconds, "compiles": len(ready), "compile_s": sum(ready)}
    result.update(compiles_total=total, leaves=leaves)
    print("RESULT " + json.dumps({**result, **phases}))


def _child(kind, directory, epochs, steps):
    argv = [__file__, "--child", kind, directory, "--epochs", str(epochs), "--steps", str(steps)]
    return result_of(argv, timeout=900)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2, help="epochs trained before the resumes")
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch (the example's 20)")
    parser.add_argument("--child", choices=["jaxjob", "orbax"])
    args = parser.parse_args()
    if args.child:
        return child_main(args)
    wall = time.perf_counter()
    base = {k: os.path.join(args.dir, k) for k in ("jaxjob", "orbax")}
    for directory in base.values():
        shutil.rmtree(directory, ignore_errors=True)
    setup = {kind: _child(kind, base[kind], args.epochs, args.steps) for kind in base}
    results = {"jaxjob": [], "orbax": []}
    for r in range(args.rounds):
        order = ["jaxjob", "orbax"] if r % 2 == 0 else ["orbax", "jaxjob"]
        for kind in order:  # one more epoch, saved, then removed
            results[kind].append(_child(kind, base[kind], args.epochs + 1, args.steps))
            drop_epoch(base[kind], args.epochs + 1)
    fields = ("seconds", "decided_s", "restored_s", "compiles", "compile_s", "compiles_total")
    out = {
        kind: {field: summary([r[field] for r in runs if field in r]) for field in fields}
        for kind, runs in results.items()
    }
    out["ratio"] = out["jaxjob"]["seconds"]["median"] / out["orbax"]["seconds"]["median"]
    out["leaves"] = setup["orbax"]["leaves"]  # params, AdamW state, rng: as the Orbax loop saves
    out["jaxjob_leaves"] = results["jaxjob"][0]["leaves"]  # its workspace: + loss, epoch counter
    out["epochs"], out["steps"] = args.epochs, args.steps
    out["wall_s"] = time.perf_counter() - wall
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
