"""Resume targets: what the runner restores, traced from the init group and checked against a save.

The init group is traced abstractly (nothing runs): its jitted programs give
each name's shape and dtype, its host steps contribute the saved shapes. The
names are checked against the checkpoint's. On the devices that saved the
checkpoint each array is restored with the sharding it was saved with: the
one the saving job's next epoch read, so nothing is compiled before the first
epoch runs. On other devices (another device or process count) the init
group's programs are compiled for their shardings, and the state is given the
shardings the epochs leave from there (:mod:`jaxjob._src.run.shardings`).
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from typing import Any

import jax
import jax.extend

from jaxjob._src.base.log import get_logger
from jaxjob._src.base.status import status_logger
from jaxjob._src.checkpoint import keypaths
from jaxjob._src.checkpoint.hostlocal import ProcessCountError
from jaxjob._src.core import checks, data
from jaxjob._src.core.job import Job
from jaxjob._src.core.session import Program, Session
from jaxjob._src.manager.shared import Manager
from jaxjob._src.multihost import hosts
from jaxjob._src.run import shardings
from jaxjob._src.run.agreement import any_process

__all__ = [
    "LocalChoice",
    "data_count_error",
    "local_choice",
    "loaded_nodes",
    "restore_targets",
    "resume_epoch",
    "set_lineage",
]

logger = get_logger(__name__)


def resume_epoch(
    manager: Manager | None, requested: int | None, nodes: list[str], timeout_s: float
) -> tuple[int | None, str]:
    """The epoch to resume from (None: from scratch) and this life's id, as process 0 decides them.

    The life (attempt: one ``train`` call) gets one id on every process:
    process 0's, sent with the resume epoch. Every checkpoint this life saves
    records it (:meth:`jaxjob.CheckpointManager.set_lineage`).

    Args:
        manager: The runner's checkpoint manager; without one, ``requested`` is the answer.
        requested: The runner's ``resume_from_epoch``; None lets the metadata handler pick.
        nodes: The nodes the job checkpoints.
        timeout_s: How long to wait for process 0's answer.

    Returns:
        ``(epoch, life)``.
    """
    if manager is None:
        return requested, uuid.uuid4().hex
    manager.set_params(nodes=nodes)
    decided = hosts.decide(
        "the resume epoch",
        lambda: {"epoch": manager.get_resume_from_epoch_id(requested), "life": uuid.uuid4().hex},
        timeout_s=timeout_s,
    )
    resume = decided["epoch"]
    two_tiers = getattr(manager, "local_tier", None) is not None and requested is None
    if resume is not None and not two_tiers:  # else the runner says which tier it resumes from
        status_logger().info("Resuming from epoch %d (%s)", resume, manager.db_prefix)
    return resume, decided["life"]


def set_lineage(manager: Manager, life: str, resumed_from: int | None) -> None:
    """Tells ``manager`` the life whose saves follow and the epoch it resumed from.

    A manager of another kind than jaxjob's (no ``set_lineage``) records none.
    """
    record = getattr(manager, "set_lineage", None)
    if record is not None:
        record(life, resumed_from)


@dataclasses.dataclass(frozen=True)
class LocalChoice:
    """The local tier's epochs that every process can resume from, and why others cannot.

    Attributes:
        epochs: Newer than the persistent tier's resume epoch, newest first,
            committed and intact (manifest, file table) on every process.
        why: Why a newer local epoch is not among them (one clause each).
    """

    epochs: list[int]
    why: list[str]


def local_choice(manager: Manager, persistent: int | None, timeout_s: float) -> LocalChoice:
    """The local epochs newer than ``persistent`` that every process holds (one exchange).

    Every process lists its own local tier; an epoch counts only if every
    process can resume from it, so processes never resume from a mix of
    epochs, and only if every process's copy of it comes from the same life
    of the job and their replicated leaves' checksums agree, so they never
    resume from a mix of lives (a host that missed a life kept its copies).
    """
    mine, why = manager.local_candidates(persistent)
    several = jax.process_count() > 1
    lineage = manager.local_lineage(mine) if several else {}
    post = {"epochs": mine, "why": why[:4], "lineage": {str(e): v for e, v in lineage.items()}}
    posts = hosts.exchange("the local tier's epochs", post, timeout_s=timeout_s)
    held = [set(p["epochs"]) for p in posts]
    common, anywhere = set.intersection(*held), set.union(*held)
    reasons: list[str] = []
    for process, post in enumerate(posts):
        lacking = sorted(anywhere - held[process])
        where = f"process {process}" if len(posts) > 1 else "this process"
        reasons += [f"{where}: {line}" for line in post["why"]]
        if lacking and not post["why"]:
            reasons.append(f"{where} has no local epoch {lacking}")
    for epoch in sorted(common, reverse=True) if several else []:
        mixed = _mixed_lineage([p["lineage"].get(str(epoch)) for p in posts])
        if mixed is not None:
            common.discard(epoch)
            reasons.append(f"local epoch {epoch}: {mixed}")
    if common:  # what the processes lack above the chosen epoch is all that matters
        newest = max(common)
        reasons = [r for r in reasons if not _only_older(r, newest)]
    return LocalChoice(sorted(common, reverse=True), reasons)


def _mixed_lineage(found: list[dict[str, Any] | None]) -> str | None:
    """Why the processes' copies of a local epoch are not one life's state, or None."""
    if any(f is None for f in found):
        missing = [p for p, f in enumerate(found) if f is None]
        return f"its life does not read on processes {missing}"
    lives = [f["life"] for f in found]
    if len(set(lives)) > 1:
        return (
            f"the processes' copies come from different lives of the job (life by process: "
            f"{lives}): a host that missed a life kept its copies"
        )
    wholes = [f["whole"] for f in found]
    for name in sorted(set.intersection(*(set(w) for w in wholes))):
        crcs = [w[name] for w in wholes]
        if len(set(crcs)) > 1:
            return f"its replicated leaf {name!r} differs between the processes (CRC-32C {crcs})"
    return None


def _only_older(reason: str, newest: int) -> bool:
    """Whether ``reason`` is about local epochs no newer than ``newest`` alone."""
    found = re.findall(r"local epochs? \[?([\d, ]+)\]?", reason)
    epochs = [int(e) for group in found for e in re.findall(r"\d+", group)]
    return bool(epochs) and max(epochs) <= newest


def restore_targets(
    job: Job, session: Session, manager: Manager, epoch: int
) -> tuple[dict[str, Any], bool]:
    """The targets of the restore of ``epoch``, and whether their shardings wait for an epoch.

    Returns:
        ``(targets, deferred)`` as :func:`jaxjob._src.run.shardings.epoch_shardings` gives them.

    Raises:
        ValueError: If the checkpoint holds other names than the init group sets.
    """
    saved = manager.saved_shapes(epoch)
    as_saved = manager.saved_targets(epoch)
    found = None
    if as_saved is not None:
        meshes: list[Any] = []
        targets, _ = _init_targets(job, session, manager, epoch, saved, meshes=meshes)
        found = _with_saved_shardings(targets, as_saved, meshes)
    timeout_s = getattr(manager, "timeout_s", hosts.DEFAULT_TIMEOUT_S)
    what = f"the restore shardings of epoch {epoch}"
    if not any_process(what, found is None, timeout_s):  # every process can use them
        logger.debug("Restoring epoch %d with the shardings it was saved with", epoch)
        return found, False
    logger.debug("Epoch %d: tracing the job's shardings (devices or shardings changed)", epoch)
    targets, abstract = _init_targets(job, session, manager, epoch, saved)
    return shardings.epoch_shardings(session, job.epoch_group, epoch, abstract, targets)


def _init_targets(
    job: Job,
    session: Session,
    manager: Manager,
    epoch: int,
    saved: dict[str, Any],
    *,
    meshes: list[Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the init group's programs set, checked against the names saved at ``epoch``.

    Without ``meshes`` the programs are compiled for their output shardings;
    with it, only traced (shapes and dtypes), and the meshes their jaxprs
    name are appended to it.

    Returns:
        ``(targets, abstract)``: the saved names the programs set, and every
        name the init group sets (its host steps' as saved).
    """
    abstract: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    nodes: dict[str, str] = {}
    steps = session.steps(job.init_group)
    for step in steps:
        if isinstance(step, Program):
            if meshes is None:
                produced = step.abstract(abstract)
            else:
                produced, jaxpr = step.shapes(abstract)
                meshes.extend(_meshes_in(jaxpr))
            targets.update(produced)
            abstract.update(produced)
            nodes.update(step.producers)
        else:
            abstract.update({k: v for k, v in saved.items() if k not in abstract})
    loaded = loaded_nodes(manager)
    checks.check_resume_names(
        [k for k in targets if loaded is None or nodes.get(k) in loaded],
        saved,
        exact=all(isinstance(step, Program) for step in steps),
        epoch=epoch,
        where=manager.db_prefix,
    )
    return {k: v for k, v in targets.items() if k in saved}, abstract


def _with_saved_shardings(
    targets: dict[str, Any], as_saved: dict[tuple[str, ...], Any], meshes: list[Any]
) -> dict[str, Any] | None:
    """``targets`` (the init group's shapes and dtypes) with the shardings they were saved with.

    Leaves are matched by key path. None (trace the job's own shardings
    instead) if a leaf's path, shape or dtype differs from the saved one (the
    restore then says how), or if the job names a mesh that no saved leaf is
    on: the context mesh (``JobRunner(mesh=)``), or one the init group's
    programs use (``meshes``, and those of their explicit-axes outputs): its
    shardings were changed since the save.
    """
    named = [leaf.sharding.mesh for leaf in jax.tree.leaves(targets) if _on_mesh(leaf)]
    context = jax.sharding.get_abstract_mesh()
    if not _meshes_saved([*meshes, *named, *([] if context.empty else [context])], as_saved):
        return None
    found = {}
    for name, target in targets.items():
        flat, tree = jax.tree_util.tree_flatten_with_path(target)
        leaves = []
        for path, leaf in flat:
            saved = as_saved.get((name, *keypaths.entry_segments(path)))
            if saved is None or (saved.shape, saved.dtype) != (leaf.shape, leaf.dtype):
                return None
            leaves.append(saved)
        found[name] = jax.tree_util.tree_unflatten(tree, leaves)
    return found


def _on_mesh(leaf: Any) -> bool:
    """Whether ``leaf`` has a named sharding (a mesh), not one device's."""
    return hasattr(getattr(leaf, "sharding", None), "mesh")


def _meshes_saved(meshes: list[Any], as_saved: dict[tuple[str, ...], Any]) -> bool:
    """Whether every mesh of ``meshes`` is one a saved leaf is on (an abstract one: abstractly)."""
    saved = {s.sharding.mesh for s in as_saved.values() if _on_mesh(s)}
    abstract = {m.abstract_mesh for m in saved}
    return all(m in saved or m in abstract for m in meshes)


def _meshes_in(jaxpr: Any) -> list[Any]:
    """The meshes of the named shardings a jaxpr's equations name (constraints, device_puts)."""
    found: list[Any] = []

    def walk(value: Any) -> None:
        if isinstance(value, jax.sharding.NamedSharding):
            found.append(value.mesh)
        elif isinstance(value, jax.extend.core.ClosedJaxpr):
            walk(value.jaxpr)
        elif isinstance(value, jax.extend.core.Jaxpr):
            for eqn in value.eqns:
                walk(list(eqn.params.values()))
        elif isinstance(value, tuple | list):
            for item in value:
                walk(item)

    walk(jaxpr)
    return found


def loaded_nodes(manager: Manager) -> set[str] | None:
    """The nodes whose checkpoints this process resumes from; None: every node."""
    managers = manager.node_managers
    if len(managers) == 1:
        return None
    me = jax.process_index()
    return {name for name, m in managers if getattr(m, "owner_process", None) in (None, me)}


def data_count_error(err: ProcessCountError, job: Job, epoch: int) -> ValueError | None:
    """The error for per-process data states resumed on another process count; None if none is.

    A per-process loader's position (:class:`jaxjob.data.Stateful`) cannot be
    split over another number of processes; index-based states are one value
    for the whole job and never get here. The message names every host-local
    leaf of ``err``, the data states and the others.
    """
    states = data.per_process_states(err.leaves, job.data_sources)
    if not states:
        return None
    own = {f"[{key!r}]" for key in states}
    others = [leaf for leaf in err.leaves if leaf not in own]
    also = (
        f" The other host-local leaves {others} cannot be split over another process count "
        "either; host_map chooses the saved copy each process gets for them too."
        if others
        else ""
    )
    return ValueError(
        f"cannot resume the data of epoch {epoch}: the per-process loader states {states} "
        f"(jaxjob.data.Stateful) were saved by {err.saved_count} processes but this job has "
        f"{err.count}, and a per-process loader's position cannot be split over another "
        f"process count. Resume on {err.saved_count} processes; or feed the job from an "
        "index-based source, whose one global cursor is split over any process count "
        "(jaxjob.data.IndexCursor, or jaxjob.data.Stateful(loader, shared=True) over Grain's "
        "ElasticIterator); or, for a loader that accepts another process's state, pass "
        "CheckpointManager(..., host_map=...) to choose the saved state each process continues "
        "from (samples may then be read twice or not at all)." + also
    )
