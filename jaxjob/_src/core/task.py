"""Tasks, task groups and nodes: the pure building blocks of a job."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import jax

from jaxjob._src.base import leaves
from jaxjob._src.base.log import warn
from jaxjob._src.core.workspace import Workspace

__all__ = ["DEFAULT_NODE", "Node", "Task", "TaskFn", "TaskGroup"]

DEFAULT_NODE = "local"
TaskFn = Callable[[Workspace], "Mapping[str, Any] | None"]
_F = TypeVar("_F", bound=Callable[..., Any])
_stacks = threading.local()


def _stack(kind: str) -> list[Any]:
    if not hasattr(_stacks, kind):
        setattr(_stacks, kind, [])
    return getattr(_stacks, kind)


class Context:
    """Mixin: ``with obj:`` makes ``obj`` the current one of its kind."""

    _kind = "context"

    def __enter__(self):
        _stack(self._kind).append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        _stack(self._kind).pop()

    @classmethod
    def _current(cls):
        stack = _stack(cls._kind)
        return stack[-1] if stack else None


class Node(Context):
    """Names the node whose checkpoint holds the leaves that init tasks create inside it.

    Example:
        >>> import jaxjob
        >>> with jaxjob.Node("trainer_0"):
        ...     jaxjob.Node.current()
        'trainer_0'
        >>> jaxjob.Node.current()
        'local'
    """

    __module__ = "jaxjob"  # its public path, in reprs, help() and pickles

    _kind = "node"

    def __init__(self, name: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"Node name must be a str, got {name!r} ({type(name).__name__})")
        if not name or "/" in name:
            raise ValueError(f"Node name must be a non-empty string without '/', got {name!r}")
        self.name = name

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Node({self.name!r})"

    @classmethod
    def current(cls) -> str:
        """Returns the name of the innermost active node, or ``"local"``."""
        node = cls._current()
        return node.name if node else DEFAULT_NODE


class Task:
    """A pure function ``Workspace -> Mapping[str, pytree] | None``: the leaves it sets.

    Created inside ``with group:`` the task is appended to that group.

    Args:
        fn: The function. It receives the workspace and returns the leaves it
            sets (a mapping of names to pytrees) or None.
        jit: True compiles it (fused with its jitted neighbours) with
            ``jax.jit``; False calls it on the host; None takes the group's
            default.
        name: A name for logs and errors; defaults to ``fn.__name__``. A
            group holds one task per name and node: a task named like one
            already in its group, in the same :class:`Node`, replaces that
            one, with a ``UserWarning`` (a re-run notebook cell). Lambdas and
            unnamed callables never replace.

    Example:
        >>> import jaxjob
        >>> group = jaxjob.TaskGroup()
        >>> with group:
        ...     t = jaxjob.Task(lambda ws: {"x": 1}, jit=False, name="one")
        >>> [task.name for task in group.tasks]
        ['one']
    """

    __module__ = "jaxjob"  # its public path, in reprs, help() and pickles

    def __init__(self, fn: TaskFn, *, jit: bool | None = None, name: str | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"Task fn must be callable, got {type(fn).__name__}")
        if jit not in (None, True, False):
            raise TypeError(f"Task jit must be True, False or None, got {jit!r}")
        self.fn = fn
        self.jit = jit
        self.name = name or getattr(fn, "__name__", "task")
        self._replaceable = bool(name) or getattr(fn, "__name__", "<lambda>") != "<lambda>"
        self.node = Node.current()
        group = TaskGroup._current()
        if group is not None:
            group._append(self)

    def __repr__(self) -> str:
        return f"Task({self.name!r}, jit={self.jit}, node={self.node!r})"

    def outputs_of(self, result: Any) -> dict[str, Any]:
        """Checks a call's result and returns it as a dict of names to pytrees.

        Raises:
            TypeError: If the result is not a mapping of names, or holds a leaf
                a checkpoint cannot hold (naming the task and the key path).
        """
        if result is None:
            return {}
        if not isinstance(result, Mapping):
            raise TypeError(
                f"task {self.name!r} must return a mapping of names to pytrees or None, "
                f"got {type(result).__name__}"
            )
        bad = next((k for k in result if not isinstance(k, str) or not k), None)
        if bad is not None:
            raise TypeError(
                f"task {self.name!r} returned the name {bad!r} ({type(bad).__name__}): "
                "workspace names must be non-empty str (a pytree under a name may have "
                "other keys)"
            )
        result = dict(result)
        for path, leaf in jax.tree_util.tree_flatten_with_path(result)[0]:
            if not leaves.checkpointable(leaf):
                raise TypeError(
                    f"task {self.name!r} returned a {type(leaf).__name__} at "
                    f"{jax.tree_util.keystr(path)}, which a checkpoint cannot hold; "
                    f"{leaves.SUPPORTED}"
                )
        return result


class TaskGroup(Context):
    """Tasks run in order on one workspace.

    Consecutive jitted tasks of a group compile to one ``jax.jit`` program.

    Args:
        jit: Default for tasks whose ``jit`` is None.
        persistent: True for the init group: the keys its tasks create become
            persistent state. In any other group, new keys are that run's
            outputs and are dropped afterwards.
        name: For logs.

    Example:
        >>> import jaxjob
        >>> group = jaxjob.TaskGroup(jit=False)
        >>> @group.task
        ... def one(ws):
        ...     return {"x": 1}
        >>> group.add(lambda ws: {"y": ws["x"] + 1}, name="two").name
        'two'
    """

    __module__ = "jaxjob"  # its public path, in reprs, help() and pickles

    _kind = "group"

    def __init__(self, *, jit: bool = True, persistent: bool = False, name: str = "group") -> None:
        self.jit = jit
        self.persistent = persistent
        self.name = name
        self.tasks: list[Task] = []

    def __repr__(self) -> str:
        return f"TaskGroup({self.name!r}, tasks={[t.name for t in self.tasks]})"

    def _append(self, task: Task) -> None:
        """Appends ``task``, or replaces the task of the same name and node (warning)."""
        for i, old in enumerate(self.tasks):
            if task._replaceable and (old.name, old.node) == (task.name, task.node):
                where = "" if task.node == DEFAULT_NODE else f" in node {task.node!r}"
                warn(
                    f"group {self.name!r} already has a task named {task.name!r}{where}: the new "
                    "one replaces it (a re-run notebook cell?); give distinct tasks distinct names"
                )
                self.tasks[i] = task
                return
        self.tasks.append(task)

    @classmethod
    def current(cls) -> TaskGroup | None:
        """Returns the innermost group entered with ``with``, or None."""
        return cls._current()

    def add(self, fn: TaskFn, *, jit: bool | None = None, name: str | None = None) -> Task:
        """Appends a task running ``fn`` and returns it."""
        with self:
            return Task(fn, jit=jit, name=name)

    def task(self, fn: _F | None = None, *, jit: bool | None = None, name: str | None = None):
        """Decorator form of :meth:`add`: ``@group.task`` or ``@group.task(jit=False)``.

        Returns the decorated function unchanged.
        """
        if fn is None:
            return lambda f: self.task(f, jit=jit, name=name)
        self.add(fn, jit=jit, name=name)
        return fn

    def is_jitted(self, task: Task) -> bool:
        """Whether ``task`` runs under ``jax.jit`` in this group."""
        return self.jit if task.jit is None else task.jit

    def used_nodes(self) -> list[str]:
        """Node names of this group's tasks, in order of first use."""
        return list(dict.fromkeys(t.node for t in self.tasks))
