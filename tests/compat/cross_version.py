"""The checkpoint format across the supported releases: one venv writes, another reads.

Usage: python tests/compat/cross_version.py write DIR
       python tests/compat/cross_version.py read DIR

``write`` saves epochs 0 and 1 of a fixed workspace (float32, bfloat16, int8 and uint32
arrays, a typed PRNG key, optax's Adam state, NumPy host arrays, Python scalars, nested
dicts, lists and tuples) under ``DIR/ckpt``, and the bytes each leaf must restore to in
``DIR/expected.npz``, beside the versions that wrote them (``DIR/written_by.json``). ``read``
(run by another venv: the lowest supported set or the newest) verifies every stored file,
restores both epochs (optax's state into its NamedTuples through a target) and compares each
leaf bitwise (type, dtype, bytes), then saves epoch 2 into the same ``db_prefix`` (as a job
resumed under the other release would) and reads that back too. It exits non-zero, naming the
leaf or file, on any difference. ``.ci/run`` runs it lowest -> newest and newest -> lowest;
``tests/compat/test_cross_version.py`` runs both steps in the test's own venv.
"""

import argparse
import json
import logging
import os
import sys
from importlib import metadata

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxjob
from jaxjob import cli

logger = logging.getLogger("cross_version")
PACKAGES = ("jaxjob", "jax", "jaxlib", "orbax-checkpoint", "tensorstore", "numpy", "optax")
EPOCHS = (0, 1)
TX = optax.adam(1e-2)


def workspace(epoch: int) -> dict:
    """The workspace saved at ``epoch``: the same values under every release (no XLA math)."""
    w = np.arange(32, dtype=np.float32).reshape(8, 4) / 7 + epoch
    params = {"w": jnp.asarray(w), "b": jnp.full(4, -0.5 * epoch, jnp.float32)}
    opt_state = TX.init(params)
    return {
        "params": params,
        "opt_state": opt_state,
        "rng": jax.random.key(epoch),
        "ema": jnp.asarray(w, jnp.bfloat16),
        "counts": jnp.arange(6, dtype=jnp.int8) - 3,
        "ids": jnp.asarray([0, 1, 2**32 - 1], jnp.uint32),
        "host": {"table": np.linspace(0, 1, 5), "mask": np.array([True, False, True])},
        "nested": [1, 2.5, (np.int64(7), np.float16(0.25))],
    }


def _as_bytes(leaf) -> np.ndarray:
    """A leaf as its raw bytes (a typed PRNG key: its key data)."""
    if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    return np.frombuffer(np.ascontiguousarray(np.asarray(leaf)).tobytes(), np.uint8)


def _describe(tree) -> dict[str, tuple[str, str, np.ndarray]]:
    """Key path -> (type, dtype, bytes) of each leaf of ``tree``."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        dtype = str(getattr(leaf, "dtype", type(leaf).__name__))
        kind = "jax.Array" if isinstance(leaf, jax.Array) else type(leaf).__name__
        data = (
            _as_bytes(leaf)
            if hasattr(leaf, "dtype")
            else np.frombuffer(repr(leaf).encode(), np.uint8)
        )
        out[jax.tree_util.keystr(path)] = (kind, dtype, data)
    return out


def _versions() -> dict[str, str]:
    return {p: metadata.version(p) for p in PACKAGES}


def write(directory: str) -> None:
    """Saves epochs 0 and 1 under ``directory/ckpt`` and what each must restore to."""
    os.makedirs(directory, exist_ok=True)
    ckpt = jaxjob.CheckpointManager(os.path.join(directory, "ckpt"))
    expected = {}
    for epoch in EPOCHS:
        ws = workspace(epoch)
        ckpt.save(epoch, ws)
        for key, (kind, dtype, data) in _describe(ws).items():
            expected[f"{epoch}|{key}|{kind}|{dtype}"] = data
    ckpt.wait_until_finished()
    ckpt.close()
    np.savez(os.path.join(directory, "expected.npz"), **expected)
    with open(os.path.join(directory, "written_by.json"), "w", encoding="utf-8") as f:
        json.dump(_versions(), f, indent=1)
    logger.info("wrote epochs %s with %s", list(EPOCHS), _versions())


def _compare(epoch: int, restored: dict, expected: dict[str, np.ndarray]) -> list[str]:
    """Each difference between ``restored`` (epoch ``epoch``) and what was saved, one line each."""
    want = {k.split("|", 1)[1]: v for k, v in expected.items() if k.startswith(f"{epoch}|")}
    got = {f"{k}|{kind}|{dtype}": data for k, (kind, dtype, data) in _describe(restored).items()}
    problems = [f"epoch {epoch}: {k} saved, not restored" for k in sorted(set(want) - set(got))]
    problems += [f"epoch {epoch}: {k} restored, not saved" for k in sorted(set(got) - set(want))]
    problems += [
        f"epoch {epoch}: {k} restored with other bytes"
        for k in sorted(set(want) & set(got))
        if not np.array_equal(want[k], got[k])
    ]
    return problems


def _check(prefix: str, epoch: int, expected: dict[str, np.ndarray]) -> list[str]:
    """Restores ``epoch`` without and with a target; the differences from what was saved."""
    like = jax.eval_shape(lambda: workspace(epoch))["opt_state"]
    targeted = jaxjob.restore(prefix, epoch=epoch, target={"opt_state": like})["opt_state"]
    restored = {**jaxjob.restore(prefix, epoch=epoch), "opt_state": targeted}  # NamedTuples
    return _compare(epoch, restored, expected)


def read(directory: str) -> None:
    """Verifies and restores what ``write`` saved under ``directory``, then appends epoch 2."""
    prefix = os.path.join(directory, "ckpt")
    with open(os.path.join(directory, "written_by.json"), encoding="utf-8") as f:
        logger.info("reading a checkpoint written with %s, with %s", json.load(f), _versions())
    with np.load(os.path.join(directory, "expected.npz")) as npz:
        expected = {k: npz[k] for k in npz.files}
    if cli.main(["verify", prefix]) != 0:
        raise SystemExit(f"jaxjob verify {prefix} found damage (above)")
    problems = [p for epoch in EPOCHS for p in _check(prefix, epoch, expected)]
    ckpt = jaxjob.CheckpointManager(prefix)
    ckpt.save(2, workspace(2))
    ckpt.wait_until_finished()
    ckpt.close()
    expected |= {
        f"2|{k}|{kind}|{dtype}": d for k, (kind, dtype, d) in _describe(workspace(2)).items()
    }
    problems += _check(prefix, 2, expected) + _check(prefix, 0, expected)
    if problems:
        raise SystemExit("\n".join(problems))
    logger.info("read epochs %s and appended epoch 2: identical", list(EPOCHS))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["write", "read"])
    parser.add_argument("directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="cross_version: %(message)s")
    {"write": write, "read": read}[args.step](args.directory)


if __name__ == "__main__":
    main(sys.argv[1:])
