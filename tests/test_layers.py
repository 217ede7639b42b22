"""jaxjob/_src is layered: each module imports only the layers below its own."""

import ast
import json
import os
import subprocess
import sys

import package_files
import pytest

import jaxjob

SRC = os.path.join(os.path.dirname(jaxjob.__file__), "_src")
MODULES = 127  # .py files under jaxjob/_src, the layers' __init__.py included

# layer -> the layers its modules may import (a module with a rule of its own: that module only)
ALLOWED = {
    "base.jax_private": set(),  # JAX only: the logger and the cross-host waits use it
    "internals.orbax_version": set(),  # the standard library only
    "internals.orbax_kvstore": {"base", "internals.orbax_version"},
    "internals.orbax_reads": {"internals.orbax_version", "internals.restore_buffers"},
    "internals.orbax_commit": {"base", "internals.orbax_version", "internals.orbax_kvstore"},
    "internals.orbax_handlers": {"internals.orbax_version", "internals.orbax_commit"},
    "internals.orbax_checkpointer": {
        "base",
        "internals.commit_barrier",
        "internals.orbax_commit",
        "internals.orbax_kvstore",
        "internals.orbax_reads",
        "internals.orbax_version",
    },
    "internals.commit_barrier": {"base"},
    "internals.orbax_files": {"base", "internals.orbax_commit"},
    "internals.restore_buffers": set(),  # NumPy and TensorStore only
    "base": set(),
    "core": {"base"},
    "multihost": {"base"},
    # restore() returns a Workspace, the one name of core it needs
    "checkpoint": {"base", "internals", "core.workspace"},
    # Orbax and its internals only through checkpoint (checkpoint.io, the one I/O handle)
    "manager": {"base", "core", "multihost", "checkpoint"},
    "run": {"base", "core", "multihost", "checkpoint", "manager"},
    "cli": None,  # anything
    "testing": None,
}
# The modules that may import internals.orbax_*, below cli and testing (which may) and outside
# internals: the one I/O handle (checkpoint.io, which alone builds Orbax checkpointers), and the
# readers of Orbax's own files (orbax_files: commit times, saved shardings).
ORBAX_PRIVATE_USERS = {
    "checkpoint.io",
    "checkpoint.listing",  # Orbax's commit times
    "checkpoint.storage",  # the saved shardings a resume restores onto
}
NO_ORBAX_LAYERS = ("base", "core", "multihost")
HEAVY = ("orbax", "tensorstore")
ORBAX_FREE_LAYERS = ("manager", "run")  # Orbax only through checkpoint.io


def _sources():
    """Module name under _src (``base.log``, ``core``) -> its parsed source."""
    found = {}
    for rel in package_files.py_files(SRC):
        module = rel[: -len(".py")].replace(os.sep, ".").removesuffix("__init__").rstrip(".")
        with open(os.path.join(SRC, rel)) as f:
            found[module or "_src"] = ast.parse(f.read())
    return found


def _imports(tree):
    """(line, imported module, names) of every import in ``tree``, in functions too."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            yield node.lineno, module, [a.name for a in node.names]


def _targets(module, names):
    """The _src modules (``checkpoint.codec``) an import of ``module`` names reaches."""
    inner = module.removeprefix("jaxjob._src").lstrip(".")
    if not module.startswith("jaxjob._src"):
        return []
    if not inner:  # from jaxjob._src import base
        return list(names)
    packages = {m for m in SOURCES if "." not in m}
    if inner in packages:  # from jaxjob._src.checkpoint import codec, keypaths
        return [f"{inner}.{n}" for n in names]
    return [inner]


def _layer_of(module):
    return module.split(".")[0]


def _allowed(module, target):
    """Whether ``module`` may import ``target``: its own layer, or a layer or module it lists."""
    own = module in ALLOWED  # a rule of its own (internals): its layer's modules are not free
    allowed = ALLOWED[module if own else _layer_of(module)]
    if allowed is None or (not own and _layer_of(target) == _layer_of(module)):
        return True
    return any(target == a or ("." not in a and _layer_of(target) == a) for a in allowed)


def _is_public(imported):
    """Whether ``imported`` is the package ``jaxjob`` or a public module of it."""
    return imported == "jaxjob" or (
        imported.startswith("jaxjob.") and not imported.startswith("jaxjob._src")
    )


def _violations(sources):
    found = []
    for module, tree in sorted(sources.items()):
        if module == "_src":
            continue
        for line, imported, names in _imports(tree):
            where = f"jaxjob/_src/{module.replace('.', '/')}.py:{line}: {imported}"
            if imported.startswith("."):
                found.append(f"{where}: relative import (write the jaxjob._src path)")
            elif _is_public(imported) and ALLOWED[_layer_of(module)] is not None:
                found.append(f"{where}: the public package is above every layer")
            for target in _targets(imported, names):
                if target not in sources:
                    found.append(f"{where}: no module {target} under _src")
                elif not _allowed(module, target):
                    rule = ALLOWED.get(module, ALLOWED[_layer_of(module)])
                    found.append(f"{where}: {module} may import only {sorted(rule)}, not {target}")
            if imported.startswith("jaxjob"):
                private = [n for n in names if n.startswith("_")]
                found += [f"{where}: imports private name {n} from another module" for n in private]
    return found


SOURCES = _sources()


def test_the_walk_sees_every_module():
    """The checks below read every module under jaxjob/_src: none can hide from them."""
    assert len(SOURCES) == MODULES, sorted(SOURCES)
    assert {_layer_of(k) for k in ALLOWED} == {_layer_of(m) for m in SOURCES if m != "_src"}


def test_each_module_imports_only_the_layers_below_its_own():
    """An import upwards, a private name imported across modules, a relative import: none."""
    found = _violations(SOURCES)
    assert not found, "\n".join(found)


def test_only_the_io_handle_and_orbax_file_readers_import_orbax_internals():
    """internals.orbax_* is imported by checkpoint.io and the readers of Orbax's files only."""
    users = set()
    for module, tree in SOURCES.items():
        for _, imported, names in _imports(tree):
            if any(t.startswith("internals.orbax_") for t in _targets(imported, names)):
                users.add(module)
    outside = {m for m in users if _layer_of(m) != "internals"}
    assert {m for m in outside if ALLOWED[_layer_of(m)] is not None} == ORBAX_PRIVATE_USERS


@pytest.mark.parametrize("layer", ORBAX_FREE_LAYERS)
def test_manager_and_run_never_import_orbax(layer):
    """The managers and the runner reach Orbax only through checkpoint.io's handle."""
    found = [
        f"jaxjob/_src/{module.replace('.', '/')}.py:{line}: {imported}"
        for module, tree in SOURCES.items()
        if _layer_of(module) == layer
        for line, imported, names in _imports(tree)
        if imported.split(".")[0] in HEAVY
        or any(t.startswith("internals.orbax_") for t in _targets(imported, names))
    ]
    assert found == [], "import checkpoint.io instead of:\n" + "\n".join(found)


@pytest.mark.parametrize("layer", NO_ORBAX_LAYERS)
def test_lower_layers_never_import_orbax_or_tensorstore(layer):
    """The logger, the job model and the cross-host waits work without Orbax installed."""
    found = [
        f"{module}:{line}: {imported}"
        for module, tree in SOURCES.items()
        if module == layer or module.startswith(layer + ".")
        for line, imported, _ in _imports(tree)
        if imported.split(".")[0] in HEAVY
    ]
    assert found == []


def test_launch_imports_the_standard_library_only():
    """``jaxjob launch`` starts without JAX: multihost.launch imports nothing else."""
    found = [
        f"{line}: {imported}"
        for line, imported, _ in _imports(SOURCES["multihost.launch"])
        if imported.split(".")[0] not in sys.stdlib_module_names
    ]
    assert found == []


def test_a_broken_rule_is_reported():
    """The checker itself: an upward import and a private name are each named."""
    tree = ast.parse(
        "from jaxjob._src.checkpoint import codec\nfrom jaxjob._src.core.task import _x\n"
    )
    found = [f for f in _violations({**SOURCES, "core.bad": tree}) if "/core/bad.py:" in f]
    assert found == [
        "jaxjob/_src/core/bad.py:1: jaxjob._src.checkpoint: core.bad may import only ['base'], "
        "not checkpoint.codec",
        "jaxjob/_src/core/bad.py:2: jaxjob._src.core.task: imports private name _x from another "
        "module",
    ]


LOADED = "import json, sys; print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))"


@pytest.mark.parametrize(
    "code, absent",
    [
        ("import jaxjob; jaxjob.Job", HEAVY),
        (
            "import jaxjob.cli\ntry:\n    jaxjob.cli.main(['launch', '--help'])\n"
            "except SystemExit:\n    pass",
            (*HEAVY, "jax"),
        ),
    ],
    ids=["jaxjob.Job", "jaxjob launch --help"],
)
def test_the_job_model_and_launch_import_no_orbax(code, absent):
    """Importing jaxjob's job model, and ``jaxjob launch --help``, leave Orbax unimported."""
    root = os.path.dirname(os.path.dirname(SRC))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", f"{code}\n{LOADED}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = set(json.loads(proc.stdout.splitlines()[-1]))
    assert loaded.isdisjoint(absent), sorted(loaded & set(absent))


def _import_graph(sources):
    """Module -> the _src modules it imports (TYPE_CHECKING and in-function imports included);
    ``from package import name`` reaches the submodule ``package.name`` where there is one."""
    graph = {}
    for module, tree in sources.items():
        targets = set()
        for _, imported, names in _imports(tree):
            inner = imported.removeprefix("jaxjob._src").lstrip(".")
            if not imported.startswith("jaxjob._src"):
                continue
            for name in names:
                sub = f"{inner}.{name}" if inner else name
                targets.add(sub if sub in sources else inner)
        graph[module] = targets - {module, ""}
    return graph


def _circle(graph):
    """One import circle of ``graph`` (``["a", "b", "a"]``), or None."""
    done, path = set(), []

    def visit(module):
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done or module not in graph:
            return None
        path.append(module)
        for target in sorted(graph[module]):
            found = visit(target)
            if found:
                return found
        path.pop()
        done.add(module)
        return None

    return next(filter(None, map(visit, sorted(graph))), None)


def test_the_circle_walk_finds_a_circle():
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_module_reaches_itself_through_its_imports():
    """No import circle anywhere under _src, TYPE_CHECKING imports included."""
    circle = _circle(_import_graph(SOURCES))
    assert circle is None, "an import circle: " + " -> ".join(circle)
