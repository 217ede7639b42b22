"""Sessions: the current workspace and the compiled programs of task groups."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from jaxjob.log import get_logger
from jaxjob.task import Task, TaskGroup
from jaxjob.workspace import Workspace

__all__ = ["Session"]

logger = get_logger(__name__)


class _Program:
    """Consecutive jitted tasks of a group, fused into one ``jax.jit`` program.

    Input buffers of names the program overwrites are donated. The names a
    program sets are found once per workspace structure by an abstract trace.
    """

    def __init__(self, tasks: list[Task]) -> None:
        self.tasks = tasks
        self.producers: dict[str, str] = {}
        self._set_names: dict[Any, frozenset[str]] = {}
        self._jitted = jax.jit(self._run, donate_argnums=0)

    def _run(self, donated: dict[str, Any], kept: dict[str, Any]) -> dict[str, Any]:
        ws = Workspace({**kept, **donated})
        out: dict[str, Any] = {}
        for task in self.tasks:
            result = task.outputs_of(task.fn(ws))
            for name in result:
                self.producers[name] = task.node
            ws = ws.set(result)
            out.update(result)
        return out

    def set_names(self, ws: Workspace) -> frozenset[str]:
        """The names this program sets when run on a workspace shaped like ``ws``."""
        structure = jax.tree_util.tree_structure(ws)
        if structure not in self._set_names:
            shapes = jax.eval_shape(self._run, {}, dict(ws))
            self._set_names[structure] = frozenset(shapes)
        return self._set_names[structure]

    def __call__(self, ws: Workspace) -> Workspace:
        donate = _donatable(ws, self.set_names(ws))
        kept = {k: v for k, v in ws.items() if k not in donate}
        out = self._jitted({k: ws[k] for k in donate}, kept)
        return ws.set(out)

    def abstract(self, ws: Mapping[str, Any]) -> dict[str, jax.ShapeDtypeStruct]:
        """Shapes, dtypes and shardings of what the program sets, without running it."""
        compiled = self._jitted.trace({}, dict(ws)).lower().compile()
        return jax.tree.map(
            lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=s.sharding),
            compiled.out_info,
        )


def _donatable(ws: Workspace, names: frozenset[str]) -> set[str]:
    """Names in ``names`` whose leaves are all ``jax.Array`` s not shared with another leaf."""
    counts: dict[int, int] = {}
    for leaf in jax.tree.leaves(ws):
        counts[id(leaf)] = counts.get(id(leaf), 0) + 1

    def ok(value: Any) -> bool:
        leaves = jax.tree.leaves(value)
        return bool(leaves) and all(
            isinstance(x, jax.Array) and counts[id(x)] == 1 and not x.is_deleted() for x in leaves
        )

    return {n for n in names if n in ws and ok(ws[n])}


class _HostStep:
    """One task called on the host."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.producers: dict[str, str] = {}

    def __call__(self, ws: Workspace) -> Workspace:
        result = self.task.outputs_of(self.task.fn(ws))
        self.producers.update(dict.fromkeys(result, self.task.node))
        return ws.set(result)


Step = _Program | _HostStep


def compile_group(group: TaskGroup) -> list[Step]:
    """Splits ``group`` into fused jitted programs and host steps, in order."""
    steps: list[Step] = []
    run: list[Task] = []
    for task in group.tasks:
        if group.is_jitted(task):
            run.append(task)
            continue
        if run:
            steps.append(_Program(run))
            run = []
        steps.append(_HostStep(task))
    if run:
        steps.append(_Program(run))
    return steps


class Session:
    """Holds the current workspace and runs task groups on it.

    One class serves a single process and every process of a
    ``jax.distributed`` job (each process runs the same groups, SPMD).
    Compiled groups are cached, so running a group again does not retrace.

    Args:
        workspace: The initial workspace; empty by default.

    Example:
        >>> import jax.numpy as jnp, jaxjob
        >>> init = jaxjob.TaskGroup(persistent=True)
        >>> _ = init.add(lambda ws: {"x": jnp.ones(2)})
        >>> step = jaxjob.TaskGroup()
        >>> _ = step.add(lambda ws: {"x": ws["x"] * 2, "norm": ws["x"].sum()})
        >>> session = jaxjob.Session()
        >>> _ = session.run(init)
        >>> out = session.run(step)
        >>> float(out["norm"]), sorted(session.workspace)
        (2.0, ['x'])
    """

    def __init__(self, workspace: Mapping[str, Any] | None = None) -> None:
        self.workspace = Workspace(workspace)
        self.key_nodes: dict[str, str] = {}
        self._compiled: dict[TaskGroup, tuple[tuple[Task, ...], list[Step]]] = {}

    @property
    def workspace(self) -> Workspace:
        """The persistent workspace."""
        return self._workspace

    @workspace.setter
    def workspace(self, value: Mapping[str, Any]) -> None:
        self._workspace = value if isinstance(value, Workspace) else Workspace(value)

    def steps(self, group: TaskGroup) -> list[Step]:
        """The compiled steps of ``group`` (compiled once, recompiled if its tasks change)."""
        tasks = tuple(group.tasks)
        cached = self._compiled.get(group)
        if cached is None or cached[0] != tasks:
            cached = (tasks, compile_group(group))
            self._compiled[group] = cached
        return cached[1]

    def run(self, group: TaskGroup) -> Workspace:
        """Runs ``group`` on the workspace.

        Returns:
            The run's workspace: persistent names plus the run's outputs.
            ``session.workspace`` keeps the outputs only for a persistent group.
        """
        before = set(self._workspace)
        ws = self._workspace
        for step in self.steps(group):
            ws = step(ws)
            if group.persistent:
                self.key_nodes.update(step.producers)
        self._workspace = ws if group.persistent else ws.select(before)
        return ws
