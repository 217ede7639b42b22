"""``jaxjob bench DIR``: what a save, a restore and saving every step cost on this disk.

Each figure is measured with :class:`jaxjob.CheckpointManager` on a workspace
shaped like the user's (a synthetic one, or the leaf shapes and dtypes of an
existing checkpoint, filled with random data) and beside a reference measured
in the same run on the same disk: a minimal writer that copies the leaves to
host memory and writes their bytes into one file, fsynced and renamed into
place. Everything is written under a fresh subdirectory of ``DIR``, removed at
the end whatever happens (an error, Ctrl-C).

Ctrl-C is recorded while measuring and raised between two timed calls: a
KeyboardInterrupt that Python raises where a signal lands can be lost (raised
inside a garbage-collector callback, such as JAX's, it is printed as
"Exception ignored" and the run went on).
"""

from __future__ import annotations

import concurrent.futures
import os
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from jaxjob._src.base import fs, preemption
from jaxjob._src.base.log import get_logger
from jaxjob._src.cli.bench_shape import Leaf, random_arrays

__all__ = ["check_directory", "measure"]

logger = get_logger(__name__)

FIGURES = (
    ("save_blocked", "save: caller blocked"),
    ("save_commit", "save: until durably committed"),
    ("restore", "full restore"),
    ("step_with_save", "step with a save every step"),
)
REFERENCE = (
    "a minimal writer: copy the leaves to host memory (blocked), write their bytes into one file "
    "(a thread when stepping), fsync, rename, fsync the directory; restore: read the file, "
    "device_put"
)


def check_directory(directory: str) -> str:
    """``directory`` normalized, once known to be an existing directory this user can write in.

    On ``gs://`` and ``s3://`` that is known only by writing: the first write says.

    Raises:
        FileNotFoundError: If it does not exist or is not a directory.
        PermissionError: If this user cannot write in it.
    """
    directory = fs.normalize(directory, "DIR")
    if fs.is_remote(directory):
        return directory
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"DIR: got {directory!r}, which is not an existing directory; expected a directory "
            "on the disk to measure, to write the benchmark's scratch files in"
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(
            f"DIR: got {directory!r}; expected a directory this user can write in"
        )
    return directory


# Ctrl-C while measuring (see the module docstring); set by measure()
_interrupt: preemption.DeferredInterrupt | None = None


def _seconds(call: Callable[[], Any]) -> float:
    """Seconds ``call`` takes; a Ctrl-C received before it is raised first."""
    _stop_if_interrupted()
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _stop_if_interrupted() -> None:
    if _interrupt is not None:
        _interrupt.raise_if_received()


def _ready(tree: Any) -> Any:
    """``tree`` once every ``jax.Array`` in it is computed (a restore is not done before)."""
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            leaf.block_until_ready()
    return tree


def _as_bytes(value: Any) -> np.ndarray:
    return np.ascontiguousarray(value).reshape(-1).view(np.uint8)


def _write_file(host: Sequence[np.ndarray], path: str) -> None:
    """The reference's durable write: every leaf's bytes in one file, fsync, rename, fsync dir."""
    if fs.is_remote(path):  # an object is durable when its upload returns
        data = b"".join(_as_bytes(v).tobytes() for v in host)
        fs.bounded(path, "a write", lambda: epath.Path(path).write_bytes(data))
        return
    with open(path + ".tmp", "wb") as f:
        for value in host:
            f.write(_as_bytes(value))
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    fs.fsync_dir(os.path.dirname(path))


def _read_file(path: str, leaves: Sequence[Leaf]) -> list[Any]:
    """The reference's restore: the file :func:`_write_file` wrote, as the leaves again."""
    if fs.is_remote(path):
        data = np.frombuffer(fs.read_bytes(path), np.uint8)
    else:
        data = np.empty(sum(leaf.nbytes for leaf in leaves), np.uint8)
        with open(path, "rb", buffering=0) as f:
            if f.readinto(memoryview(data)) != data.size:
                raise OSError(f"{path!r} is shorter than the {data.size} bytes just written")
    arrays, offset = [], 0
    for leaf in leaves:
        value = data[offset : offset + leaf.nbytes].view(leaf.dtype).reshape(leaf.shape)
        arrays.append(value if leaf.host_local else jax.device_put(value))
        offset += leaf.nbytes
    return arrays


def _step_loop() -> Callable[[int], float]:
    """A call running ``count`` iterations of a jitted matmul loop, returning its seconds."""

    @jax.jit
    def loop(x: jax.Array, count: jax.Array) -> jax.Array:
        return jax.lax.fori_loop(0, count, lambda _, y: jnp.tanh(y @ y), x)

    x = jax.random.normal(jax.random.key(0), (256, 256)) / 16
    loop(x, 1).block_until_ready()  # compiled once: the count is an argument
    return lambda count: _seconds(lambda: loop(x, count).block_until_ready())


def _step(seconds: float) -> Callable[[], float]:
    """A call running a jitted step of about ``seconds``, returning its seconds."""
    run, count, took = _step_loop(), 1, 0.0
    while took < min(0.05, seconds / 2):  # long enough to time
        count *= 4
        took = run(count)
    count = max(1, round(seconds * count / took))
    return lambda: run(count)


def _saving_steps(step: Callable[[], float], save: Callable[[int], Any], repeats: int) -> list:
    """Seconds of ``repeats`` steps, each started right after ``save(i)``."""
    return [_seconds(lambda i=i: (save(i), step())) for i in range(repeats)]


def _durable_saves(save: Callable[[int], Callable[[], Any]], repeats: int) -> dict[str, list]:
    """Samples of the blocked and committed times of ``repeats`` saves after one to warm up.

    ``save(i)`` blocks as a save does and returns the wait for its commit.
    """
    samples: dict[str, list[float]] = {"save_blocked": [], "save_commit": []}
    for i in range(repeats + 1):
        _stop_if_interrupted()
        start = time.perf_counter()
        wait = save(i)
        blocked = time.perf_counter() - start
        wait()
        if i:
            samples["save_blocked"].append(blocked)
            samples["save_commit"].append(time.perf_counter() - start)
    return samples


def _jaxjob_saves(manager: Any, workspace: dict, repeats: int) -> dict[str, list]:
    """Samples of the save and restore figures of ``manager`` (epochs 0 to ``repeats``)."""

    def save(epoch: int) -> Callable[[], None]:
        manager.save(epoch, workspace)
        return manager.wait_until_finished

    samples = _durable_saves(save, repeats)
    samples["restore"] = [_seconds(lambda: _ready(manager.load(repeats))) for _ in range(repeats)]
    return samples


def _reference_saves(arrays: list, leaves: Sequence[Leaf], path: str, repeats: int) -> dict:
    """Samples of the save and restore figures of the minimal writer, writing ``path``."""

    def save(_: int) -> Callable[[], None]:
        host = [np.array(a) for a in arrays]
        return lambda: _write_file(host, path)

    samples = _durable_saves(save, repeats)
    samples["restore"] = [
        _seconds(lambda: _ready(_read_file(path, leaves))) for _ in range(repeats)
    ]
    return samples


def _reference_saving_steps(
    arrays: list, step: Callable[[], float], path: str, repeats: int
) -> list[float]:
    """Step seconds with the minimal writer's thread writing ``path`` after each step's copy."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jaxjob-bench") as pool:
        pending: list[concurrent.futures.Future] = []

        def save(_: int) -> None:
            if pending:
                pending.pop().result()  # one write in flight, as jaxjob's
            pending.append(pool.submit(_write_file, [np.array(a) for a in arrays], path))

        times = _saving_steps(step, save, repeats)
        pending.pop().result()
    return times


def _samples(scratch: str, leaves: Sequence[Leaf], repeats: int, step_s: float) -> tuple:
    """``(jaxjob's samples, the reference's, the step's seconds alone)`` under ``scratch``."""
    import jaxjob

    arrays = random_arrays(leaves)
    raw = fs.join(scratch, "raw.bin")
    manager = jaxjob.CheckpointManager(fs.join(scratch, "ckpt"), keep=jaxjob.keep.Last(2))
    try:
        ours = _jaxjob_saves(manager, {"leaves": arrays}, repeats)
        theirs = _reference_saves(arrays, leaves, raw, repeats)
        commit = max(statistics.median(s["save_commit"]) for s in (ours, theirs))
        step = _step(max(step_s, 1.5 * commit))  # the write fits in the step it overlaps
        alone = statistics.median(step() for _ in range(repeats))
        save = lambda i: manager.save(repeats + 1 + i, {"leaves": arrays})  # noqa: E731
        ours["step_with_save"] = _saving_steps(step, save, repeats)
        manager.wait_until_finished()
    finally:
        manager.close()
    theirs["step_with_save"] = _reference_saving_steps(arrays, step, raw, repeats)
    return ours, theirs, alone


def measure(
    directory: str, leaves: Sequence[Leaf], *, repeats: int = 3, step_seconds: float = 0.2
) -> dict[str, Any]:
    """Measures jaxjob and the reference under a scratch subdirectory of ``directory``.

    The scratch subdirectory is removed at the end, whatever happens.

    Returns:
        The report: for each figure the medians of jaxjob and of the
        reference in seconds and their ratio, the step alone and the slowdowns.
    """
    global _interrupt
    scratch = fs.join(directory, f"jaxjob-bench-{uuid.uuid4().hex[:12]}")
    fs.makedirs(scratch)
    try:
        logger.info("measuring under %s", scratch)
        with preemption.DeferredInterrupt() as _interrupt:
            ours, theirs, alone = _samples(scratch, leaves, repeats, step_seconds)
            _interrupt.raise_if_received()
    finally:
        _interrupt = None
        if fs.exists(scratch):
            fs.rmtree(scratch)
    figures = {}
    for name, what in FIGURES:
        mine, other = statistics.median(ours[name]), statistics.median(theirs[name])
        figures[name] = {"what": what, "jaxjob_s": mine, "reference_s": other}
        figures[name]["ratio"] = mine / other
    steps = figures["step_with_save"]
    return {
        "directory": directory,
        "leaves": len(leaves),
        "bytes": sum(leaf.nbytes for leaf in leaves),
        "repeats": repeats,
        "reference": REFERENCE,
        "step_s": alone,
        "slowdown_pct": {k: 100 * (steps[f"{k}_s"] / alone - 1) for k in ("jaxjob", "reference")},
        "figures": figures,
    }
