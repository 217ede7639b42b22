"""A job for the multi-process tests, run on every process under ``jaxjob launch``.

Usage: ``python mp_job.py DB_PREFIX EPOCHS`` with options as JSON in ``MP_JOB``:
``kill``/``hang``/``fail``: ``[epoch, process]`` where that process SIGKILLs
itself mid-epoch, sleeps mid-epoch, or has its save of that epoch fail;
``term``: ``[epoch, process]`` where that process sends itself SIGTERM mid-epoch
(a preemption: each process prints ``PREEMPTED {json}`` and exits 75);
``deny``: ``[epoch, process]`` where that process's metadata handler reports the
checkpoints as not accessible at that epoch's save;
``policy`` (on_save_error), ``timeout_s``, ``host_map`` ("mod2"), ``save_every_epochs``,
``max_host_bytes`` (a host-memory budget: the resume reads the leaves in groups).
It prints one ``RESULT {json}`` line per process.
"""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import json
import os
import signal
import sys
import time

import jaxjob

jaxjob.distributed.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from mp_digest import digest  # noqa: E402

job_start.imported()

PREFIX, EPOCHS = sys.argv[1], int(sys.argv[2])
OPTS = json.loads(os.environ.get("MP_JOB", "{}"))
ME = jax.process_index()
MESH = jax.make_mesh((jax.device_count(),), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
ROWS = NamedSharding(MESH, P("d"))
TX = optax.adam(0.05)


def at(option: str, seen: int) -> bool:
    """Whether option ``[epoch, process]`` names this process and the epoch now running."""
    return OPTS.get(option) == [seen + 1, ME]


def init(ws):
    w = jax.lax.with_sharding_constraint(jax.random.normal(jax.random.key(0), (16, 4)), ROWS)
    return {"w": w, "opt": TX.init(w), "rng": jax.random.key(1)}


def cursor(ws):
    """Host-local state: each process's own data cursor and epoch count."""
    return {"cursor": np.array([1000 * ME, 0], np.int64), "seen": 0}


def train(ws):
    rng, key = jax.random.split(ws["rng"])
    x = jax.lax.with_sharding_constraint(jax.random.normal(key, (64, 16)), ROWS)
    y = x @ jnp.arange(64.0).reshape(16, 4) / 64

    def loss_fn(w):
        return jnp.mean((x @ w - y) ** 2)

    loss, grad = jax.value_and_grad(loss_fn)(ws["w"])
    updates, opt = TX.update(grad, ws["opt"], ws["w"])
    return {"w": optax.apply_updates(ws["w"], updates), "opt": opt, "rng": rng, "loss": loss}


LAST_EPOCH_END = [time.monotonic()]


def advance(ws):
    LAST_EPOCH_END[0] = time.monotonic()
    if at("kill", ws["seen"]):
        os.kill(os.getpid(), signal.SIGKILL)
    if at("term", ws["seen"]):
        os.kill(os.getpid(), signal.SIGTERM)
    if at("hang", ws["seen"]):
        time.sleep(120)
    return {"cursor": ws["cursor"] + np.array([1, 1]), "seen": ws["seen"] + 1}


class _FailedWrite:
    """A commit future whose background write fails, as a full disk would make it."""

    def result(self, timeout=None):
        raise OSError(f"injected: disk full on process {ME}")


def inject_save_failure(epoch: int) -> None:
    """This process's background write of ``epoch``'s state fails (the other processes' succeed)."""
    async_save = ocp.PyTreeCheckpointHandler.async_save
    left = [1]

    async def failing_async_save(self, directory, *args, **kwargs):
        futures = await async_save(self, directory, *args, **kwargs)
        if f"/local.{epoch}.orbax-checkpoint-tmp" in str(directory) and left[0]:
            left[0] = 0
            futures = [*(futures or []), _FailedWrite()]
        return futures

    ocp.PyTreeCheckpointHandler.async_save = failing_async_save


class _DenyingHandler(jaxjob.DiskMetadataHandler):
    """Reports the checkpoints as not accessible at the save of ``epoch`` (saving every epoch)."""

    def __init__(self, epoch: int) -> None:
        super().__init__()
        self.epoch, self.checks = epoch, 0

    def cp_accessible(self, epoch=None):
        self.checks += epoch is None
        denied = epoch is None and self.checks == self.epoch + 1
        return super().cp_accessible(epoch) and not denied


def main() -> int:
    if os.environ.get("MP_DEBUG"):
        import faulthandler

        faulthandler.dump_traceback_later(int(os.environ["MP_DEBUG"]), exit=True)
    if OPTS.get("fail") and OPTS["fail"][1] == ME:
        inject_save_failure(OPTS["fail"][0])
    job = jaxjob.Job()
    job.init_group.add(init)
    job.init_group.add(cursor, jit=False)
    job.epoch_group.add(train)
    job.epoch_group.add(advance, jit=False)
    jaxjob.epoch_limiter(job, EPOCHS)
    host_map = (lambda p: p % 2) if OPTS.get("host_map") == "mod2" else None
    deny = OPTS.get("deny")
    ckpt = jaxjob.CheckpointManager(
        PREFIX,
        metadata_handler=_DenyingHandler(deny[0]) if deny and deny[1] == ME else None,
        timeout_s=OPTS.get("timeout_s", 60),
        write_timeout_s=OPTS.get("write_timeout_s", 60),
        host_map=host_map,
        max_host_bytes=OPTS.get("max_host_bytes"),
    )
    runner = jaxjob.JobRunner(
        job,
        ckpt,
        on_save_error=OPTS.get("policy", "warn"),
        save_every_epochs=OPTS.get("save_every_epochs", 1),
    )
    session = jaxjob.Session()
    try:
        last = runner.train(session)
    except jaxjob.Preempted as err:
        seen = session.workspace["seen"]
        print(
            "PREEMPTED", json.dumps({"process": ME, "epoch": err.epoch, "seen": seen}), flush=True
        )
        sys.exit(75)  # both processes exit together: jax.distributed's exit barrier is met
    except jaxjob.CheckpointSaveError as err:
        print("RAISED", err, flush=True)
        jaxjob.hosts.exchange("the error printout", {}, timeout_s=30)
        os._exit(3)  # skip jax.distributed's exit barrier: the launcher stops the others
    except jaxjob.HostTimeoutError as err:
        waited = time.monotonic() - LAST_EPOCH_END[0]  # since this process ended its epoch
        print("TIMEOUT", err.missing, f"{waited:.2f}", err, flush=True)
        os._exit(4)
    ws = session.workspace
    saves = [h for h in ckpt.metadata_handler.history if h["action"] == "checkpoint_save"]
    result = {
        "process": ME,
        "last": last,
        "cursor": ws["cursor"].tolist(),
        "seen": ws["seen"],
        "digest": digest({k: ws[k] for k in ("w", "opt", "rng")}),
        "w_sharding": ws["w"].sharding == ROWS,
        "save_errors": [e.epoch for e in runner.save_errors],
        "error_processes": [e.processes for e in runner.save_errors],
        "last_save_stats": next(iter(saves[-1]["stats"].values())) if saves else None,
    }
    print("RESULT", json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
