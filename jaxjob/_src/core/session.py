"""Sessions: the current workspace and the compiled programs of task groups."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

import jax
import numpy as np

from jaxjob._src.base.log import get_logger
from jaxjob._src.base.preemption import DeferredInterrupt
from jaxjob._src.core.task import Task, TaskGroup
from jaxjob._src.core.workspace import Workspace

__all__ = ["Session", "consumed"]

logger = get_logger(__name__)


class Program:
    """Consecutive jitted tasks of a group, fused into one ``jax.jit`` program.

    Input buffers of names the program overwrites are donated. The names a
    program sets are found once per workspace structure by an abstract trace.
    """

    def __init__(self, tasks: list[Task]) -> None:
        self.tasks = tasks
        self.producers: dict[str, str] = {}
        self._set_names: dict[Any, frozenset[str]] = {}

        def run(donated: dict[str, Any], kept: dict[str, Any]) -> dict[str, Any]:
            return self._run(donated, kept)

        run.__name__ = run.__qualname__ = self.name
        self._jitted = jax.jit(run, donate_argnums=0)

    @property
    def name(self) -> str:
        """The program's name in JAX's logs and profiles: its tasks' names, e.g. ``train``."""
        return re.sub(r"\W+", "_", " ".join(t.name for t in self.tasks)).strip("_")[:120] or "tasks"

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
        """The names this program sets when run on a workspace shaped like ``ws``.

        Found by tracing the program as its call will, donating every
        donatable name: when the program overwrites all of them (the usual
        case) that call donates exactly those, and ``jax.jit`` reuses this
        trace instead of tracing the program again.
        """
        structure = jax.tree_util.tree_structure(ws)
        if structure not in self._set_names:
            guess = _donatable(ws, frozenset(ws))
            traced = self._jitted.trace(*self._split(ws, guess))
            self._set_names[structure] = frozenset(traced.out_info)
        return self._set_names[structure]

    @staticmethod
    def _split(ws: Workspace, donate: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The program's arguments: the donated names, and the others."""
        return {k: ws[k] for k in donate}, {k: v for k, v in ws.items() if k not in donate}

    def shapes(self, ws: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
        """Shapes and dtypes of what the program sets, and its jaxpr: a trace, no compile."""
        traced = self._jitted.trace({}, dict(ws))
        return traced.out_info, traced.jaxpr

    def __call__(self, ws: Workspace) -> Workspace:
        donate = _donatable(ws, self.set_names(ws))
        return ws.set(self._jitted(*self._split(ws, donate)))

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

    def __call__(self, ws: Workspace, traced: Collection[str] = ()) -> Workspace:
        """Calls the task on ``ws``; the leaves of ``traced`` it returns must keep their types.

        Raises:
            TypeError: If the task changes the tree structure or a dtype of a
                name in ``traced`` (naming the task, the key path, what it
                returned and what was expected).
            ValueError: If it changes a shape of one.
        """
        result = self.task.outputs_of(self.task.fn(ws))
        for name in sorted(set(result) & set(traced) & set(ws)):
            _check_kept(self.task.name, name, ws[name], result[name])
        self.producers.update(dict.fromkeys(result, self.task.node))
        return ws.set(result)


def _describe(leaf: Any) -> str:
    if isinstance(leaf, jax.Array):
        kind = "jax.Array"
    elif isinstance(leaf, np.ndarray):
        kind = "numpy.ndarray"
    elif isinstance(leaf, np.generic):
        kind = "NumPy scalar"
    else:
        kind = type(leaf).__name__
    return f"{kind} of dtype {np.dtype(leaf.dtype)}, shape {tuple(np.shape(leaf))}"


def _check_kept(task: str, name: str, before: Any, after: Any) -> None:
    """Raises if a host task's value of a traced persistent name differs from ``before`` in type.

    A resume restores such a name to the abstract value the init group's
    jitted tasks (and the epoch group's) trace, so a host task that changes
    its structure, dtype or shape would save checkpoints that cannot be
    resumed from: it is reported here, when the task returns, before any save.
    """
    old, old_tree = jax.tree_util.tree_flatten_with_path(before)
    new, new_tree = jax.tree_util.tree_flatten_with_path(after)
    why = (
        "a resume restores it as the init group's jitted tasks create it, so a host task must "
        "return it with the same structure, dtypes and shapes (cast it, e.g. "
        "jnp.asarray(x, dtype), or make the task jitted)"
    )
    if old_tree != new_tree:
        raise TypeError(
            f"task {task!r} changed the structure of the persistent leaf {name!r}: it returned "
            f"{new_tree}, expected {old_tree}; {why}"
        )
    for (path, was), (_, now) in zip(old, new, strict=True):
        if not hasattr(was, "dtype"):
            continue
        where = f"[{name!r}]{jax.tree_util.keystr(path)}"
        dtype = getattr(now, "dtype", None)
        if dtype is None or np.dtype(dtype) != np.dtype(was.dtype):
            got = _describe(now) if dtype is not None else f"Python {type(now).__name__}"
            raise TypeError(
                f"task {task!r} changed the dtype of the persistent leaf {where}: it returned "
                f"a {got}, expected dtype {np.dtype(was.dtype)} (it was a {_describe(was)}); {why}"
            )
        if tuple(np.shape(now)) != tuple(was.shape):
            raise ValueError(
                f"task {task!r} changed the shape of the persistent leaf {where}: it returned "
                f"a {_describe(now)}, expected shape {tuple(was.shape)} (it was a "
                f"{_describe(was)}); {why}"
            )


Step = Program | _HostStep


def compile_group(group: TaskGroup) -> list[Step]:
    """Splits ``group`` into fused jitted programs and host steps, in order."""
    steps: list[Step] = []
    run: list[Task] = []
    for task in group.tasks:
        if group.is_jitted(task):
            run.append(task)
            continue
        if run:
            steps.append(Program(run))
            run = []
        steps.append(_HostStep(task))
    if run:
        steps.append(Program(run))
    return steps


class Session:
    """Holds the current workspace and runs task groups on it.

    One class serves a single process and every process of a
    ``jax.distributed`` job (each process runs the same groups, SPMD).
    Compiled groups are cached, so running a group again does not retrace.

    Args:
        workspace: The initial workspace; empty by default.

    Attributes:
        key_nodes: The node of each persistent name (the task that set it).
        traced_names: Persistent names that jitted tasks of a persistent
            group (the init group) set. A resume restores them to the
            abstract values those tasks trace, so a host task of the init or
            the epoch group that returns one must keep its structure, dtypes
            and shapes: it raises as it returns otherwise (see ``run``'s
            ``keep_traced``). The runner sets them on resume.
        partial: True after :meth:`run` raised (an exception, Ctrl-C) part-way
            through a group whose jitted programs had consumed (donated) the
            workspace's buffers: :attr:`workspace` then holds the group's
            latest live values, neither those before the group nor after it.
            False after a run that completed or raised before any donation
            (:attr:`workspace` is then as before the group).

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

    __module__ = "jaxjob"  # its public path, in reprs, help() and pickles

    def __init__(self, workspace: Mapping[str, Any] | None = None) -> None:
        self.workspace = Workspace(workspace)
        self.key_nodes: dict[str, str] = {}
        self.traced_names: set[str] = set()
        self.partial = False
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

    def run(
        self,
        group: TaskGroup,
        *,
        before_program: Callable[[Workspace], Workspace] | None = None,
        keep_traced: bool = False,
    ) -> Workspace:
        """Runs ``group`` on the workspace.

        The workspace never holds a donated buffer, whatever interrupts the
        run: a program's call and the workspace's swap to its results are
        one step that Ctrl-C cannot split (a KeyboardInterrupt meanwhile is
        raised right after it; see :attr:`partial`). A Ctrl-C during a
        program's first call, which compiles it, is raised once it returns.

        Args:
            group: The group.
            before_program: Called with the run's workspace before each
                jitted program of the group; the program runs on what it returns.
            keep_traced: Check that host tasks keep the structure, dtypes and
                shapes of :attr:`traced_names` (the runner's epoch group: what
                it returns is saved); a persistent group is always checked.

        Returns:
            The run's workspace: persistent names plus the run's outputs.
            ``session.workspace`` keeps the outputs only for a persistent group.

        Raises:
            TypeError: If a checked host task changes the structure or a dtype
                of a name in :attr:`traced_names` (ValueError: a shape), before
                the value reaches the workspace.
        """
        before = set(self._workspace)
        ws = self._workspace
        traced = self.traced_names if keep_traced or group.persistent else set()
        self.partial = False
        for step in self.steps(group):
            if isinstance(step, Program):
                ws = ws if before_program is None else before_program(ws)
                if group.persistent:
                    self.traced_names.update(step.set_names(ws))
                ws = self._swap(step, ws, before, group.persistent)
            else:
                ws = step(ws, traced)
            if group.persistent:
                self.key_nodes.update(step.producers)
        with DeferredInterrupt() as deferred:
            self._workspace, self.partial = (ws if group.persistent else ws.select(before)), False
        deferred.raise_if_received()
        return ws

    def _swap(
        self, program: Program, ws: Workspace, before: set[str], persistent: bool
    ) -> Workspace:
        """Runs ``program`` on ``ws``; the session's workspace moves to its live results at once.

        The call donates buffers that the session's workspace may hold: from
        the call until the workspace holds the results, SIGINT is held back
        (:class:`~jaxjob._src.base.preemption.DeferredInterrupt`) and its
        KeyboardInterrupt raised after.
        """
        with DeferredInterrupt() as deferred:
            ws = program(ws)
            if consumed(self._workspace):
                self._workspace = ws if persistent else ws.select(before)
                self.partial = True
        deferred.raise_if_received()
        return ws


def consumed(ws: Mapping[str, Any]) -> bool:
    """Whether a ``jax.Array`` leaf of ``ws`` was donated (deleted)."""
    return any(isinstance(x, jax.Array) and x.is_deleted() for x in jax.tree.leaves(ws))
