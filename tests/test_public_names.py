"""Public names everywhere a user looks: loggers, exceptions, messages, docs and tracebacks."""

import ast
import importlib
import inspect
import json
import logging
import os
import pickle
import pkgutil
import re
import subprocess
import sys
import textwrap
import traceback

import pytest

import jaxjob

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.dirname(jaxjob.__file__)
PRIVATE = re.compile(r"jaxjob[./]_src")
# a string that is only an import path (jaxjob/__init__.py's table, log.py's prefix): code, not text
IMPORT_PATH = re.compile(r"jaxjob\._src(\.\w+)*\.?")
EXCEPTIONS = sorted(
    n
    for n in jaxjob.__all__
    if isinstance(v := getattr(jaxjob, n), type) and issubclass(v, Exception)
)


def _private_modules():
    src = importlib.import_module("jaxjob._src")
    return [m.name for m in pkgutil.walk_packages(src.__path__, prefix="jaxjob._src.")]


def test_every_module_logs_under_a_public_name_in_the_jaxjob_hierarchy():
    """Each module logs under a public name below "jaxjob", whose level governs them all."""
    named = {}
    for name in _private_modules():
        adapter = getattr(importlib.import_module(name), "logger", None)
        if isinstance(adapter, logging.LoggerAdapter):
            named[name] = adapter.logger.name
    assert len(named) > 20, named
    assert not {m: n for m, n in named.items() if "_src" in n or n.split(".")[0] != "jaxjob"}
    assert named["jaxjob._src.run.runner"] == "jaxjob.runner"
    assert named["jaxjob._src.run.save_failures"] == "jaxjob.runner"
    assert named["jaxjob._src.manager.save.writer"] == "jaxjob.manager"
    assert named["jaxjob._src.manager.lock.writer_lock"] == "jaxjob.manager.lock"
    assert named["jaxjob._src.checkpoint.restore"] == "jaxjob.restore"
    assert named["jaxjob._src.multihost.distributed"] == "jaxjob.distributed"
    top = logging.getLogger("jaxjob")
    for name in set(named.values()):
        logger = logging.getLogger(name)
        while logger is not top and logger.parent is not None:
            logger = logger.parent
        assert logger is top, name


def _package_trees():
    """Each .py file under jaxjob/, parsed: ``(path, ast)``."""
    for folder, _, files in os.walk(PACKAGE):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path) as f:
                yield path, ast.parse(f.read())


def test_no_module_names_a_logger_after_itself():
    """No module of jaxjob calls logging.getLogger(__name__) (a private name); they log through
    get_logger, which names the logger publicly."""
    found = []
    for path, tree in _package_trees():
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.args]
        for node in calls:
            named = getattr(node.func, "attr", None) == "getLogger"
            argument = node.args[0]
            own = isinstance(argument, ast.Name) and argument.id == "__name__"
            private = own or "_src" in str(getattr(argument, "value", ""))
            if named and private:
                found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    assert found == []


@pytest.mark.parametrize("name", EXCEPTIONS)
def test_public_exceptions_are_named_jaxjob(name):
    """Tracebacks and reprs name each public exception jaxjob.X, the path users import it by."""
    cls = getattr(jaxjob, name)
    assert cls.__module__ == "jaxjob"
    assert f"{cls.__module__}.{cls.__qualname__}" == f"jaxjob.{name}"
    assert f"'jaxjob.{name}'" in repr(cls)


def _public_classes():
    modules = ["jaxjob", *(f"jaxjob.{m}" for m in jaxjob._SUBMODULES)]
    for module in map(importlib.import_module, modules):
        for name in module.__all__:
            if isinstance(value := getattr(module, name), type):
                yield f"{module.__name__}.{name}", value


def test_public_classes_pickle_by_their_public_path():
    """Each public class pickles by the path it names (jaxjob.Job, jaxjob.keep.Last), which a
    fresh process resolves to the same class."""
    for path, cls in _public_classes():
        assert f"{cls.__module__}.{cls.__qualname__}" == path or cls.__module__ == "jaxjob"
        assert pickle.loads(pickle.dumps(cls)) is cls, path
    code = "import pickle, sys\nclasses = pickle.loads(bytes.fromhex(sys.argv[1]))\n"
    code += "print([c.__name__ for c in classes])"
    classes = [jaxjob.Job, jaxjob.keep.Last, jaxjob.CheckpointOptions, jaxjob.testing.Kill]
    out = _python(code, pickle.dumps(classes).hex()).stdout.strip()
    assert out == repr([c.__name__ for c in classes])


def test_user_reachable_exceptions_are_public():
    """Every exception class jaxjob raises to users has a public name (internal signals excepted).

    A new one: export it from jaxjob/__init__.py and give it ``__module__ = "jaxjob"``; or, if
    jaxjob always catches it (never raised to, nor chained into what reaches, a user), list it
    below."""
    internal = {"Lost", "_Refused"}  # caught inside the lock; never reach a user
    found = set()
    for name in _private_modules():
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            is_error = inspect.isclass(value) and issubclass(value, Exception)
            if is_error and value.__module__ in (name, "jaxjob"):
                found.add(attr)
    assert found - internal <= set(EXCEPTIONS), sorted(found - internal - set(EXCEPTIONS))


_INSTANCES = """
import jaxjob
errors = [
    jaxjob.CheckpointSaveError(3, "runs/x/local.3", OSError("disk full"), [0, 1]),
    jaxjob.CheckpointSaveError(4, "runs/x/local.4", "a message"),
    jaxjob.Preempted(7),
    jaxjob.CheckpointInUseError("the lock of 'local' is held by host a, pid 12"),
    jaxjob.CorruptCheckpointError("leaf 'w' of epoch 3: checksum mismatch"),
    jaxjob.HostTimeoutError("the barrier 'save'", [1, 2], 5.0),
    jaxjob.LineageError("two runs"),
    jaxjob.MissingExtraError("gs:// needs gcsfs"),
    jaxjob.ProcessCountError(["['rng']"], 2, 1),
    jaxjob.StorageError("s3://b/x: connection refused"),
    jaxjob.StorageTimeoutError("no answer from http://x"),
    jaxjob.UnstorableLeafError("leaf 'w': uint4"),
]
"""
_DESCRIBE = """
import json, sys
def describe(err):
    state = {k: repr(v) for k, v in sorted(vars(err).items())}
    return [type(err).__module__, type(err).__qualname__, str(err), repr(err.args), state]
"""


def _python(code, *args, check=True):
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert not check or proc.returncode == 0, proc.stderr
    return proc


def test_exceptions_pickle_across_processes(tmp_path):
    """Each public exception pickled in one process unpickles in another as the same error:
    its class, message, args and attributes (a fresh process that has not imported jaxjob)."""
    path = str(tmp_path / "errors.pickle")
    made = _python(
        _INSTANCES
        + _DESCRIBE
        + "import pickle\n"
        + "pickle.dump(errors, open(sys.argv[1], 'wb'))\n"
        + "print(json.dumps([describe(e) for e in errors]))\n",
        path,
    )
    loaded = _python(
        _DESCRIBE
        + "import pickle\n"
        + "print(json.dumps([describe(e) for e in pickle.load(open(sys.argv[1], 'rb'))]))\n",
        path,
    )
    sent, received = json.loads(made.stdout), json.loads(loaded.stdout)
    assert {e[1] for e in sent} == set(EXCEPTIONS)
    assert received == sent


_JOB = """
import json, logging, os, signal, sys
import jax.numpy as jnp
import jaxjob

records = open(sys.argv[2], "w")

class Record(logging.Handler):
    def emit(self, record):
        header = []
        if record.exc_info:
            text = logging.Formatter().formatException(record.exc_info)
            header = [l for l in text.splitlines() if not l.startswith(" ")]
        records.write(json.dumps([record.name, record.getMessage(), header]) + "\\n")
        records.flush()

logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
logging.getLogger("jaxjob").setLevel(logging.DEBUG)
logging.getLogger().addHandler(Record())
job = jaxjob.Job()
empty = {"w": jnp.zeros((0,))} if sys.argv[3] == "unstorable" else {}  # no save can store it
job.init_group.add(lambda ws: {"x": jnp.zeros(()), **empty})
job.epoch_group.add(lambda ws: {"x": ws["x"] + 1})
jaxjob.epoch_limiter(job, 4)

def misbehave(ws):
    if int(ws["x"]) == 2 and sys.argv[3] == "preempted":
        os.kill(os.getpid(), signal.SIGTERM)
    return {}

job.epoch_group.add(misbehave, jit=False)
jaxjob.JobRunner(job, jaxjob.CheckpointManager(sys.argv[1])).train(jaxjob.Session())
"""


@pytest.mark.parametrize(
    ("how", "error"), [("preempted", "Preempted"), ("unstorable", "UnstorableLeafError")]
)
def test_a_failing_job_speaks_in_public_names(tmp_path, how, error):
    """A job logging at DEBUG whose train raises (preempted; a leaf no save can store): no log
    record's name or message, and no traceback line but the frames', names jaxjob's private
    modules; the traceback ends in jaxjob.<Error>."""
    records = tmp_path / "records.jsonl"
    proc = _python(_JOB, str(tmp_path / "ckpt"), str(records), how, check=False)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith(f"jaxjob.{error}: "), lines[-1]
    headers = [line for line in lines if not line.startswith(" ")]
    assert not [line for line in headers if PRIVATE.search(line)], headers
    logged = [json.loads(line) for line in records.read_text().splitlines()]
    ours = [r for r in logged if r[0].split(".")[0] == "jaxjob"]
    assert ours, logged
    assert not [r for r in logged if "_src" in r[0] and r[0].startswith("jaxjob")]
    assert not [r for r in logged if PRIVATE.search(r[1]) or any(PRIVATE.search(h) for h in r[2])]


def _docstring_nodes(tree):
    """The string constants that are docstrings (module, class, function)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _private_text_in_literals():
    """Non-docstring string literals in jaxjob/ (messages, log lines) naming a private module."""
    found = []
    for path, tree in _package_trees():
        docstrings = _docstring_nodes(tree)
        public_module = os.path.dirname(path) == PACKAGE
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if "_src" not in node.value or IMPORT_PATH.fullmatch(node.value):
                continue
            if id(node) in docstrings and not public_module:
                continue  # an implementation module's own notes: see _public_docstrings
            found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    return found


def _public_objects():
    """Every public module, name, and public attribute of a public class, by its public path."""
    modules = ["jaxjob", *(f"jaxjob.{m}" for m in jaxjob._SUBMODULES), "jaxjob.orbax_adapter"]
    for module_name in modules:
        module = importlib.import_module(module_name)
        yield module_name, module
        for name in getattr(module, "__all__", []):
            value = getattr(module, name)
            yield f"{module_name}.{name}", value
            if inspect.isclass(value):
                for attr in dir(value):
                    if not attr.startswith("_"):
                        yield f"{module_name}.{name}.{attr}", inspect.getattr_static(value, attr)


def _public_docstrings():
    """Docstrings a user reads (help(), the API reference) that name a private module."""
    found = []
    for where, value in _public_objects():
        value = getattr(value, "__func__", value)
        doc = value.__doc__ if inspect.isroutine(value) or inspect.isclass(value) else None
        if inspect.ismodule(value) or isinstance(value, property):
            doc = value.__doc__
        if isinstance(doc, str) and "_src" in doc:
            found.append(where)
    return found


def _private_literals(path):
    """The string literals of ``path`` that name a private module, other than import paths."""
    with open(path) as f:
        tree = ast.parse(f.read())
    return [
        f"{os.path.relpath(path, ROOT)}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if "_src" in node.value and not IMPORT_PATH.fullmatch(node.value)
    ]


def _private_text_in_docs():
    """Lines of README.md, docs/, examples/ and notebooks/ that name a private module."""
    found = []
    paths = [os.path.join(ROOT, "README.md")]
    for folder in ("docs", "examples", "notebooks"):
        for sub, _, files in os.walk(os.path.join(ROOT, folder)):
            if "_build" not in sub and ".ipynb_checkpoints" not in sub:
                paths += [os.path.join(sub, f) for f in sorted(files)]
    for path in paths:
        if path.endswith((".png", ".svg", ".pdf", ".pyc")):
            continue
        if path.endswith(".py") and os.path.relpath(path, ROOT).startswith("docs"):
            found += _private_literals(path)  # the docs build's code: its messages only
            continue
        with open(path, errors="replace") as f:
            for number, line in enumerate(f, 1):
                if "_src" in line.replace("_src/", ""):
                    found.append(f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()[:100]}")
    return found


def test_no_private_module_names_in_what_users_read():
    """No message, log line or public docstring in jaxjob/, and no line of the README, docs,
    examples or notebooks names a private module (``jaxjob._src...``); a folder in a file
    tree (``_src/``) is a path for contributors, not a name."""
    assert _private_text_in_literals() == []
    assert _public_docstrings() == []
    assert _private_text_in_docs() == []


def test_the_traceback_header_of_a_public_error_is_public():
    """format_exception_only names the error as users catch it: jaxjob.Preempted, not its module."""
    line = traceback.format_exception_only(jaxjob.Preempted(3))[-1]
    assert line.startswith("jaxjob.Preempted: preempted: epoch 3 is saved")
