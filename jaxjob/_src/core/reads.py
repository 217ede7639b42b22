"""What a task's function can read: the objects its code names, followed into the code it calls.

A function's own code names objects in several places that
``inspect.getclosurevars`` does not look at: comprehensions, generator
expressions, lambdas and nested functions have code objects of their own
(``co_consts``), and helper functions read objects of their own. This module
walks all of them, statically (nothing is called): the code objects nested in
the function, the globals, closure cells and defaults they name, the
attributes those names take of a module or an object (``loaders.BATCHES``),
and, to a bounded depth, the functions among them (helpers, bound methods
and their object's attributes, ``functools.partial``, callable objects).
Library code (the standard library, installed packages, jaxjob itself) is
not followed: its module-level objects (id counters) are not the task's data.
"""

from __future__ import annotations

import functools
import inspect
import os
import sysconfig
import types
from collections.abc import Iterator
from typing import Any

__all__ = ["MAX_DEPTH", "named_objects"]

MAX_DEPTH = 4  # how many helper calls deep the walk follows


@functools.cache
def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.add(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    return tuple(os.path.join(os.path.realpath(r), "") for r in roots)


def _is_library(filename: str | None) -> bool:
    """Whether code from ``filename`` is the standard library, a package, or jaxjob's own."""
    if not filename or filename.startswith("<frozen"):
        return True
    if filename.startswith("<"):  # a notebook cell, a doctest, exec'd source: the user's
        return False
    return os.path.realpath(filename).startswith(_library_roots())


def _function(obj: Any) -> tuple[types.FunctionType | None, list[tuple[str, Any]]]:
    """The plain function ``obj`` runs, and the objects bound into it (a partial's arguments)."""
    if isinstance(obj, types.MethodType):
        return _function(obj.__func__)[0], [("self", obj.__self__)]
    if isinstance(obj, functools.partial):
        bound = [(f"{_name(obj.func)} argument", a) for a in obj.args]
        return _function(obj.func)[0], bound + list(obj.keywords.items())
    if isinstance(obj, types.FunctionType):
        return obj, []
    call = inspect.getattr_static(type(obj), "__call__", None)  # a callable object's method
    return (call, [("self", obj)]) if isinstance(call, types.FunctionType) else (None, [])


def _name(obj: Any) -> str:
    return getattr(obj, "__name__", type(obj).__name__)


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` and the code objects nested in it (comprehensions, lambdas, nested functions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _direct(fn: types.FunctionType, names: set[str]) -> list[tuple[str, Any]]:
    """The globals, closure cells and defaults that ``fn`` 's code names."""
    found = [(n, fn.__globals__[n]) for n in sorted(names) if n in fn.__globals__]
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
        try:
            found.append((name, cell.cell_contents))
        except ValueError:  # a cell not yet filled (a name assigned later)
            continue
    arguments = fn.__code__.co_varnames[: fn.__code__.co_argcount]
    defaults = fn.__defaults__ or ()
    found += list(zip(arguments[len(arguments) - len(defaults) :], defaults, strict=True))
    found += list((fn.__kwdefaults__ or {}).items())
    return found


def _attributes(value: Any, names: set[str]) -> list[tuple[str, Any]]:
    """The attributes among ``names`` of a user module or object (read from its ``__dict__``)."""
    if isinstance(value, types.ModuleType):
        if _is_library(getattr(value, "__file__", None)):
            return []
    elif isinstance(value, type | types.FunctionType) or not hasattr(value, "__dict__"):
        return []
    try:
        attrs = vars(value)
    except TypeError:  # a __dict__ that is not a mapping
        return []
    return [(f"{_name(value)}.{n}", attrs[n]) for n in sorted(names) if n in attrs]


def named_objects(fn: Any, depth: int = MAX_DEPTH) -> list[tuple[str, Any]]:
    """The ``(name, object)`` of every object ``fn`` 's code (and its helpers') names.

    Args:
        fn: A function, bound method, ``functools.partial`` or callable object
            (its class's ``__call__``); builtins give nothing.
        depth: How many calls deep helper functions are followed.

    Example:
        >>> rows = iter(range(3))
        >>> def helper():
        ...     return next(rows)
        >>> task = lambda ws: {"x": [helper() for _ in range(2)]}
        >>> [name for name, value in named_objects(task) if value is rows]
        ['rows']
    """
    found: dict[int, tuple[str, Any]] = {}
    _visit(fn, depth, found, set())
    return list(found.values())


def _visit(obj: Any, depth: int, found: dict[int, tuple[str, Any]], seen: set[int]) -> None:
    fn, bound = _function(obj)
    for name, value in bound:
        found.setdefault(id(value), (name, value))
    if fn is None or id(fn) in seen or _is_library(fn.__code__.co_filename):
        return
    seen.add(id(fn))
    names = {n for code in _codes(fn.__code__) for n in code.co_names}
    named = bound + _direct(fn, names)  # ``self.batches``: an attribute of the bound object
    named += [a for _, value in list(named) for a in _attributes(value, names)]
    for name, value in named:
        found.setdefault(id(value), (name, value))
        if depth > 0:
            _visit(value, depth - 1, found, seen)
