"""Session-wide test set-up: one private temporary directory and one compilation cache.

* Every temporary file of the run (pytest's ``tmp_path``, ``tempfile`` in tests, doctests,
  notebooks and every child process, which inherit ``TMPDIR``) lands under one directory that
  the run removes when it exits, so the suite leaves nothing in the system's temporary folder.
* Child processes (killed and relaunched jobs, ``jaxjob launch`` workers) compile the same small
  programs again and again; a persistent JAX compilation cache inside that directory lets each
  program compile once per run. It is only a cache of XLA executables: a hit runs the same
  executable a compile would have produced, so bitwise comparisons are unaffected.

With pytest-xdist the controller makes the directory and its workers (child processes that
inherit the environment) share it. The tests that share an expensive module-scoped run (a
reference job, a multi-process job) are kept on one worker (``--dist loadgroup``), so each such
run happens once; every other test goes to whichever worker is free.
"""

import atexit
import os
import shutil
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

sys.path.insert(0, os.path.dirname(__file__))

from cloud_servers import (  # noqa: E402,F401  (session fixtures: real local object stores)
    cloud_servers,
    gcs_bucket,
    gcs_prefix,
    s3_bucket,
    s3_prefix,
)

# module -> its expensive module-scoped fixture; tests using it share one xdist worker (one
# group per fixture parameter, e.g. the 1- and 2-process references of test_testing.py).
_SHARED_RUNS = {
    "test_cli.py": "run_dir",
    "test_exactness.py": "reference",
    "test_multiprocess.py": "exchanges",
    "test_multiprocess_faults.py": "reference",
    "test_testing.py": "reference",
}


def pytest_collection_modifyitems(config, items):
    """Tests sharing one expensive module-scoped run go to one worker under ``--dist loadgroup``."""
    for item in items:
        module = os.path.basename(str(item.fspath))
        fixture = _SHARED_RUNS.get(module)
        if fixture is None or fixture not in item.fixturenames:
            continue
        callspec = getattr(item, "callspec", None)
        param = callspec.params.get(fixture, "") if callspec else ""
        item.add_marker(pytest.mark.xdist_group(f"{module}:{fixture}:{param}"))
