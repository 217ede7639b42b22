"""The docstring examples of every jaxjob module run, and reach public names by public paths."""

import ast
import doctest
import importlib
import inspect
import pkgutil

import package_files
import pytest

import jaxjob

MODULES = package_files.PY_FILES - 1  # every module and package under jaxjob/ but jaxjob


def _modules():
    import jaxjob as pkg

    return [m.name for m in pkgutil.walk_packages(pkg.__path__, prefix="jaxjob.")]


def test_the_doctest_walk_sees_every_module():
    """The doctest runner walks jaxjob/ recursively: a moved module cannot drop out of it."""
    found = _modules()
    assert len(found) == MODULES, sorted(found)
    assert {"jaxjob._src.core.task", "jaxjob.keep", "jaxjob._src.base"} <= set(found)


class _Finder(doctest.DocTestFinder):
    """Finds each docstring in the module that defines it, a public class's too.

    A public class says ``jaxjob`` as its ``__module__`` (jaxjob.Preempted in tracebacks), which
    would hide it from the module that defines it and show it in ``jaxjob`` once loaded there.
    """

    def _from_module(self, module, object):
        if inspect.isclass(object) and object.__module__ == "jaxjob":
            return jaxjob._EXPORTS.get(object.__name__) == module.__name__
        return super()._from_module(module, object)


def _doctests(module):
    return _Finder().find(importlib.import_module(module))


def test_public_classes_examples_are_found_where_defined():
    """A public class's examples are found in its defining module, and only there."""
    names = [t.name for t in _doctests("jaxjob._src.base.errors")]
    assert "jaxjob._src.base.errors.Preempted" in names
    assert not [t for t in _doctests("jaxjob") if "Preempted" in t.name]


@pytest.mark.parametrize("module", _modules())
def test_docstring_examples_run(module):
    """Every docstring example in the package runs as written."""
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in _doctests(module):
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


def _public_names():
    """Every public name and its path: jaxjob.X, and jaxjob.hosts.X for the public modules."""
    names = {}
    for module in ("distributed", "hosts"):
        names.update((n, f"jaxjob.{module}.{n}") for n in getattr(jaxjob, module).__all__)
    names.update((n, f"jaxjob.{n}") for n in jaxjob.__all__)
    return names


def _path_violations(test, public):
    """Public names an example uses bare, or imports through a module path (not jaxjob.X)."""
    defined, found = set(), []
    for example in test.examples:
        tree = ast.parse(example.source)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jaxjob"):
                found.append(f"from {node.module} import ...")
            elif isinstance(node, ast.Import | ast.ImportFrom):
                defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.FunctionDef | ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                defined.add(node.id)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in public and node.id not in defined:
                found.append(f"{node.id} (use {public[node.id]})")
            is_jaxjob = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            if is_jaxjob and node.value.id == "jaxjob" and node.attr not in jaxjob.__all__:
                found.append(f"jaxjob.{node.attr} (not a public name)")
    return found


@pytest.mark.parametrize("module", _modules())
def test_docstring_examples_use_public_paths(module):
    """Examples reach public names as jaxjob.X (jaxjob.hosts.X), never by a module path or bare."""
    public = _public_names()
    tests = _doctests(module)
    found = {t.name: v for t in tests if (v := _path_violations(t, public))}
    assert not found, found
