"""Session-wide test set-up: one private temporary directory and one compilation cache.

* Every temporary file of the run (pytest's ``tmp_path``, ``tempfile`` in tests, doctests,
  notebooks and every child process, which inherit ``TMPDIR``) lands under one directory that
  the run removes when it exits, so the suite leaves nothing in the system's temporary folder.
* Child processes (killed and relaunched jobs, ``jaxjob launch`` workers) compile the same small
  programs again and again; a persistent JAX compilation cache inside that directory lets each
  program compile once per run. It is only a cache of XLA executables: a hit runs the same
  executable a compile would have produced, so bitwise comparisons are unaffected. (On the CPU
  JAX 0.10 keys the executables of process i > 0 of a multi-process job by their process, and
  only process 0 writes the cache; the job scripts of ``tests/jobs`` let the others write
  their own entries too: ``job_start._cache_every_process``.)

With pytest-xdist the controller makes the directory and its workers (child processes that
inherit the environment) share it. The tests that share an expensive module-scoped run (a
reference job, a multi-process job) are kept on one worker (``--dist loadgroup``), so each such
run happens once; every other test goes to whichever worker is free.
"""

import atexit
import collections
import contextlib
import logging
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

_ROOT_VAR = "JAXJOB_TEST_TMP_ROOT"
_OWNER = _ROOT_VAR not in os.environ
if _OWNER:
    os.environ[_ROOT_VAR] = tempfile.mkdtemp(prefix="jaxjob-tests-")
    # Registered before anything imports jaxjob, so it runs after jaxjob's own exit handlers
    # (atexit is last-in, first-out): locks are released before their directories go.
    atexit.register(shutil.rmtree, os.environ[_ROOT_VAR], ignore_errors=True)
_ROOT = os.environ[_ROOT_VAR]
os.environ["TMPDIR"] = _ROOT
tempfile.tempdir = _ROOT
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_ROOT, "jax-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# Hundreds of child processes import jaxjob and the job scripts: let the first one write their
# bytecode (into the gitignored __pycache__ folders) rather than each compile it again, which a
# PYTHONDONTWRITEBYTECODE set by the machine would make them do.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

sys.path[:0] = [os.path.dirname(__file__), os.path.join(os.path.dirname(__file__), "jobs")]

import zygote  # noqa: E402
from cloud_servers import (  # noqa: E402,F401  (session fixtures: real local object stores)
    cloud_servers,
    gcs_bucket,
    gcs_prefix,
    s3_bucket,
    s3_prefix,
)
from long_tier import LONG_TESTS  # noqa: E402

# module -> its expensive module-scoped fixture; tests using it share one xdist worker (one
# group per fixture parameter, e.g. the 1- and 2-process references of test_testing.py).
_SHARED_RUNS = {
    "test_commands.py": "run_dir",
    "test_exactly_once.py": "references",  # scenarios/: the uninterrupted runs, made on first use
    "test_digits_example.py": "one_process",
    "test_exactness.py": "reference",
    "test_multiprocess.py": "exchanges",
    "test_multiprocess_faults.py": "reference",
    "test_testing.py": "reference",
}


# The modules whose tests run longest (several child processes each, measured with
# --durations): started first, so that no worker is still running one when the others are done.
_LONG_MODULES = (
    "test_multiprocess_faults.py",
    "test_testing.py",
    "test_preemption.py",
    "test_digits_example.py",
    "test_hosts.py",
    "test_multiprocess.py",
    "test_exactly_once.py",
)


def pytest_configure(config):
    """Python children of the processes that run tests start from a zygote (``zygote.py``):
    forked with JAX and Orbax already imported. Not in pytest-xdist's controller, whose
    children are its workers."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        zygote.install()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (it renames node ids)
def pytest_collection_modifyitems(config, items):
    """Tests sharing one expensive module-scoped run go to one worker under ``--dist loadgroup``;
    the shared runs and the longest modules are handed out first."""
    for item in items:
        module = os.path.basename(str(item.fspath))
        if item.nodeid in LONG_TESTS:
            item.add_marker(pytest.mark.long)
        fixture = _SHARED_RUNS.get(module)
        if fixture is None or fixture not in item.fixturenames:
            continue
        callspec = getattr(item, "callspec", None)
        param = callspec.params.get(fixture, "") if callspec else ""
        item.add_marker(pytest.mark.xdist_group(f"{module}:{fixture}:{param}"))
    items.sort(key=_start_order)  # stable: the order within each class stays as collected


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """Fails the run if ``--dist loadgroup`` ignored the groups (each shared run would run on
    several workers): pytest 9.2 broke pytest-xdist 3.8's grouping, which renames node ids."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [
        i.nodeid
        for i in session.items
        if i.get_closest_marker("xdist_group") and "@" not in i.nodeid
    ]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist did not group {len(lost)} tests (e.g. {lost[0]}): their shared runs "
            "would run once per worker; use the pytest of constraints.txt"
        )


def _start_order(item) -> int:
    if item.get_closest_marker("xdist_group") is not None:
        return 0
    return 1 if os.path.basename(str(item.fspath)) in _LONG_MODULES else 2


# Opt-in: JAXJOB_TEST_CHILD_CPU=FILE records, per test (its set-up included: a module-scoped
# run counts for the first test that uses it), the CPU seconds (user + sys) of the child processes
# it started and how many it started (``jaxjob launch -n N`` counts its N); the run ends with the
# modules that cost most. Off by default: nothing is patched or recorded.
_CHILD_CPU = os.environ.get("JAXJOB_TEST_CHILD_CPU")
_started: collections.Counter = collections.Counter()  # program -> processes started


def _program(argv: list) -> str:
    """What a child runs: its script's name, ``-m module``, ``-c`` or the executable's name."""
    name = os.path.basename(argv[0]) if argv else "?"
    if name.startswith("python"):
        for i, arg in enumerate(argv[1:], 1):
            if arg in ("-m", "-c"):
                name = f"{arg} {argv[i + 1] if arg == '-m' and i + 1 < len(argv) else ''}".strip()
                break
            if not arg.startswith("-"):
                name = os.path.basename(arg)
                break
    return re.sub(r"[\s,=]+", "_", name)


def _count_started(init):
    def counting(self, args, *rest, **kwargs):
        argv = [os.fspath(a) for a in ([args] if isinstance(args, (str, bytes)) else args)]
        if "launch" in argv and "--" in argv:  # jaxjob launch -n N -- PROGRAM: N more processes
            with contextlib.suppress(ValueError, IndexError):
                n = int(argv[argv.index("-n", argv.index("launch")) + 1])
                _started[_program(argv[argv.index("--") + 1 :])] += n
        _started[_program(argv)] += 1
        init(self, args, *rest, **kwargs)

    return counting


if _CHILD_CPU:
    subprocess.Popen.__init__ = _count_started(subprocess.Popen.__init__)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _CHILD_CPU:
        yield
        return
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), _started.copy()
    yield
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    programs = ",".join(f"{p}={n}" for p, n in (_started - started).items())
    with open(_CHILD_CPU, "a") as f:
        f.write(f"{item.nodeid}\t{cpu:.3f}\t{programs}\n")


def pytest_terminal_summary(terminalreporter):
    if (
        not _CHILD_CPU
        or not os.path.exists(_CHILD_CPU)
        or hasattr(terminalreporter.config, "workerinput")
    ):
        return
    modules: dict[str, list] = {}
    programs: collections.Counter = collections.Counter()
    with open(_CHILD_CPU) as f:
        for line in f:
            nodeid, cpu, started = line.rstrip("\n").split("\t")
            total = modules.setdefault(nodeid.split("::")[0], [0.0, 0])
            total[0] += float(cpu)
            for entry in filter(None, started.split(",")):
                program, _, n = entry.rpartition("=")
                total[1] += int(n)
                programs[program] += int(n)
    write = terminalreporter.write_line
    terminalreporter.section("child processes per module: CPU s (user + sys), processes")
    for module, (cpu, started) in sorted(modules.items(), key=lambda m: -m[1][0]):
        write(f"{cpu:8.1f} {started:5d}  {module}")
    cpu, started = (sum(m[i] for m in modules.values()) for i in (0, 1))
    write(f"{cpu:8.1f} {started:5d}  all")
    write("processes per program: " + ", ".join(f"{p} {n}" for p, n in programs.most_common()))


@pytest.fixture(autouse=True)
def _fail_points_counted_per_test():
    """``JAXJOB_FAIL_AT=point:n`` set by a test in this process counts that test's passes only
    (an xdist worker runs many tests: another's passes of the same point would shift n)."""
    from jaxjob._src.base import faults

    faults.reset()


@pytest.fixture(scope="module")
def compile_cache():
    """The run's JAX persistent compilation cache, for a module's child jobs: each restart
    compiles little (every process of a multi-process job writes it: ``job_start``). The
    run's own values, so those jobs can start from the zygote (``zygote.py``), whose imports
    read them."""
    names = (
        "JAX_COMPILATION_CACHE_DIR",
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
    )
    return {name: os.environ[name] for name in names}


_GUARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


def _signal_state() -> tuple:
    """The process's handlers for the signals jaxjob and its tests touch, and its blocked mask."""
    handlers = tuple(signal.getsignal(s) for s in _GUARDED_SIGNALS)
    return handlers, frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, []))


def _leaked(before: tuple, after: tuple) -> bool:
    """Whether a test left a Python handler of its own or a changed signal mask behind.

    A switch between Python's own SIGINT handler and SIG_IGN/SIG_DFL is not a leak of jaxjob's or
    a test's: an xdist worker started from a background shell ignores SIGINT, and a library such
    as the notebook client reinstalls Python's handler.
    """
    builtin = (signal.SIG_DFL, signal.SIG_IGN, signal.default_int_handler, None)
    return before[1] != after[1] or any(
        b != a and a not in builtin for b, a in zip(before[0], after[0], strict=True)
    )


@pytest.fixture(autouse=True)
def _no_signal_leak(request):
    """Each test starts with the signal state the worker had; one that leaks a handler fails.

    Child processes inherit ignored dispositions and the signal mask, so a test that changed them
    would change what SIGINT does to the jobs later tests start on the same worker (the Ctrl-C
    tests once saw their job ignore SIGINT in a full run, not alone: the worker, started from a
    background shell, ignored it). The Ctrl-C tests set it explicitly in the child as well.
    """
    before = _signal_state()
    yield
    after = _signal_state()
    if after == before:
        return
    for sig, handler in zip(_GUARDED_SIGNALS, before[0], strict=True):
        if handler is not None:
            signal.signal(sig, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, before[1])
    if _leaked(before, after):
        pytest.fail(
            f"{request.node.nodeid} left a signal handler or mask behind "
            f"(handlers and mask before: {before}, after: {after})"
        )


def _logging_state() -> tuple:
    """logging.disable's level and each jaxjob logger's disabled and propagate flags."""
    loggers = logging.root.manager.loggerDict.items()
    flags = {
        name: (lg.disabled, lg.propagate)
        for name, lg in loggers
        if name.startswith("jaxjob") and isinstance(lg, logging.Logger)
    }
    return logging.root.manager.disable, flags


@pytest.fixture(autouse=True)
def _no_logging_leak(request):
    """A test (or a library it runs in this process) that mutes jaxjob's loggers fails, by name.

    Later tests on the same worker read jaxjob's warnings with ``caplog``; a logger left
    disabled (``logging.config`` disables the loggers that exist when it runs) would hide them.
    """
    level, before = _logging_state()
    yield
    level_after, after = _logging_state()
    changed = {n: f for n, f in after.items() if n in before and before[n] != f}
    if level_after == level and not changed:
        return
    logging.disable(level)
    for name, (disabled, propagate) in before.items():
        logger = logging.getLogger(name)
        logger.disabled, logger.propagate = disabled, propagate
    pytest.fail(
        f"{request.node.nodeid} muted jaxjob's logging: logging.disable {level} -> {level_after}, "
        f"loggers changed (disabled, propagate): {changed}"
    )
