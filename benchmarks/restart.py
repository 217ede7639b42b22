"""Restart cost: a resumed transformer's restore-then-first-step time, jaxjob against plain Orbax.

    python benchmarks/restart.py DIR --rounds 3

A 6.8M-parameter decoder-only transformer (plain JAX, Adam) is trained for two
epochs of 4 steps, once by ``jaxjob.JobRunner`` and once by a hand-written loop
on Orbax's ``CheckpointManager``. Then, alternating, fresh processes resume each
and run one more epoch's first step; the clock starts after the imports and
stops when that step's result is ready. A third kind of process re-runs the
finished jaxjob job (``train()`` has nothing left to do). Each process also
counts its XLA compilations (JAX's ``backend_compile`` events). Prints one
``RESULT {json}`` line: medians, min-max and the ratio jaxjob / Orbax.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import count_compiles, drop_epoch, result_of, summary  # noqa: E402

VOCAB, DIM, LAYERS, HEADS, SEQ, BATCH, STEPS = 256, 384, 4, 6, 64, 8, 4


def model():
    """(init, step, batches): the transformer's parameter init, train step and data."""
    import jax
    import jax.numpy as jnp
    import optax

    tx = optax.adam(1e-3)

    def init_params(key):
        keys = iter(jax.random.split(key, 4 + 4 * LAYERS))

        def dense(n, m):
            return jax.random.normal(next(keys), (n, m)) / n**0.5

        layers = [
            {
                "qkv": dense(DIM, 3 * DIM),
                "out": dense(DIM, DIM),
                "up": dense(DIM, 4 * DIM),
                "down": dense(4 * DIM, DIM),
            }
            for _ in range(LAYERS)
        ]
        return {"embed": dense(VOCAB, DIM), "pos": dense(SEQ, DIM), "layers": layers}

    def forward(params, tokens):
        x = params["embed"][tokens] + params["pos"]
        mask = jnp.tril(jnp.ones((SEQ, SEQ), bool))
        for layer in params["layers"]:
            h = x / (jnp.linalg.norm(x, axis=-1, keepdims=True) + 1e-6)
            q, k, v = jnp.split(h @ layer["qkv"], 3, axis=-1)
            q, k, v = (t.reshape(BATCH, SEQ, HEADS, DIM // HEADS) for t in (q, k, v))
            att = jnp.einsum("bqhd,bkhd->bhqk", q, k) / (DIM // HEADS) ** 0.5
            att = jax.nn.softmax(jnp.where(mask, att, -1e9), axis=-1)
            x = x + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(BATCH, SEQ, DIM) @ layer["out"]
            h = x / (jnp.linalg.norm(x, axis=-1, keepdims=True) + 1e-6)
            x = x + jax.nn.gelu(h @ layer["up"]) @ layer["down"]
        return x @ params["embed"].T

    def loss_fn(params, tokens):
        logits = forward(params, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    def step(params, opt, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    def init():
        params = init_params(jax.random.key(0))
        return params, tx.init(params)

    def batch(epoch, i):
        key = jax.random.fold_in(jax.random.key(1), epoch * STEPS + i)
        return jax.random.randint(key, (BATCH, SEQ + 1), 0, VOCAB)

    return init, step, batch


def transformer_job(epochs, steps=STEPS):
    """The transformer as a ``jaxjob.Job``: init makes the parameters, the Adam state and an
    epoch counter; each epoch trains ``steps`` steps; ``epochs`` epochs."""
    import jax

    import jaxjob

    init, step, batch = model()

    def init_task(ws):
        params, opt = init()
        return {"params": params, "opt": opt, "epoch": jax.numpy.zeros((), "int32")}

    def epoch_task(ws):
        params, opt, loss = _epoch(step, batch, ws["params"], ws["opt"], ws["epoch"], steps)
        return {"params": params, "opt": opt, "epoch": ws["epoch"] + 1, "loss": loss}

    job = jaxjob.Job()
    job.init_group.add(init_task)
    job.epoch_group.add(epoch_task)
    jaxjob.epoch_limiter(job, epochs)  # its counter fuses into the epoch's program
    return job


def run_jaxjob(directory, epochs, first_step_only):
    """Trains (or resumes) the jaxjob job to ``epochs``: (seconds to the first step, or to the
    return of a run with no epoch left, compiles, last epoch). It always ends its epochs."""
    import jax

    import jaxjob

    compiles = count_compiles()
    job = transformer_job(epochs)
    start = time.perf_counter()
    done = {}

    def first_step(ws):
        if "s" not in done:
            jax.block_until_ready(ws["loss"])
            done["s"] = time.perf_counter() - start
        return {}

    job.epoch_group.add(first_step, jit=False)
    runner = jaxjob.JobRunner(job, jaxjob.CheckpointManager(directory))
    last = runner.train(jaxjob.Session())
    seconds = done.get("s", time.perf_counter() - start)
    return seconds, len(compiles), last


def run_orbax(directory, epochs, first_step_only):
    """The hand-written loop: restore the newest step (or init), then epochs up to ``epochs``."""
    import jax
    import orbax.checkpoint as ocp

    compiles = count_compiles()
    init, step, batch = model()
    start = time.perf_counter()
    manager = ocp.CheckpointManager(directory)
    abstract = jax.eval_shape(init)
    latest = manager.latest_step()
    if latest is None:
        params, opt = jax.jit(init)()
        first = 0
    else:
        params, opt = manager.restore(latest, args=ocp.args.StandardRestore(abstract))
        first = latest
    train = jax.jit(lambda p, o, e: _epoch(step, batch, p, o, e), donate_argnums=(0, 1))
    seconds = None
    for epoch in range(first, epochs):
        params, opt, loss = train(params, opt, epoch)
        if seconds is None:
            jax.block_until_ready(loss)
            seconds = time.perf_counter() - start
            if first_step_only:
                break
        manager.save(epoch + 1, args=ocp.args.StandardSave((params, opt)))
    manager.wait_until_finished()
    manager.close()
    return seconds, len(compiles), epochs


def _epoch(step, batch, params, opt, epoch, steps=STEPS):
    for i in range(steps):
        params, opt, loss = step(params, opt, batch(epoch, i))
    return params, opt, loss


def child_main(args):
    fn = run_jaxjob if args.kind == "jaxjob" else run_orbax
    seconds, compiles, last = fn(args.dir, args.epochs, args.first_step_only)
    print("RESULT " + json.dumps({"seconds": seconds, "compiles": compiles, "last": last}))


def _child(kind, directory, epochs, first_step_only=False):
    argv = [__file__, "--child", kind, directory, "--epochs", str(epochs)]
    return result_of(argv + ["--first-step-only"] * first_step_only, timeout=900)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=["jaxjob", "orbax"])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--first-step-only", action="store_true")
    args = parser.parse_args()
    if args.child:
        args.kind = args.child
        return child_main(args)
    base = {k: os.path.join(args.dir, k) for k in ("jaxjob", "orbax")}
    for kind, directory in base.items():
        _child(kind, directory, 2)  # two epochs trained and saved
    results = {"jaxjob": [], "orbax": [], "rerun": []}
    for r in range(args.rounds):
        order = ["jaxjob", "orbax"] if r % 2 == 0 else ["orbax", "jaxjob"]
        for kind in order:  # epoch 3's first step; jaxjob's epoch 3 is saved, then removed
            results[kind].append(_child(kind, base[kind], 3, first_step_only=True))
            drop_epoch(base[kind], 3)
        results["rerun"].append(_child("jaxjob", base["jaxjob"], 2))
    out = {
        kind: {field: summary([r[field] for r in runs]) for field in ("seconds", "compiles")}
        for kind, runs in results.items()
    }
    out["ratio"] = out["jaxjob"]["seconds"]["median"] / out["orbax"]["seconds"]["median"]
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
