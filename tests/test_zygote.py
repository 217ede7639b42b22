"""The suite's fork server (tests/zygote.py): a child it forks is the process ``python`` gives."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or os.environ.get("JAXJOB_TEST_ZYGOTE") == "0",
    reason="the zygote serves Linux runs that leave it on",
)

PROBE = """
import json, os, sys
print(json.dumps({
    "preloaded": "orbax.checkpoint" in sys.modules,
    "name": __name__, "file": globals().get("__file__"), "argv": sys.argv,
    "path0": sys.path[0], "cwd": os.getcwd(), "ppid": os.getppid(),
    "env": os.environ.get("PROBE_VALUE"), "stdin": sys.stdin.read(),
}))
"""


def probe(tmp_path, how, **env):
    """Runs the probe as ``python -c``, ``python SCRIPT`` or ``python -m``, with ``env``."""
    script = tmp_path / "probe_mod.py"
    script.write_text(PROBE)
    argv = {
        "-c": ["-c", PROBE, "x"],
        "script": [str(script), "x"],
        "-m": ["-m", "probe_mod", "x"],
    }[how]
    out = subprocess.run(
        [sys.executable, *argv],
        input="from stdin",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PROBE_VALUE": "42", **env},
        check=True,
    )
    return json.loads(out.stdout)


@pytest.mark.parametrize("how", ["-c", "script", "-m"])
def test_a_forked_child_sees_what_a_fresh_python_sees(tmp_path, how):
    """argv, __main__, sys.path[0], cwd, environment and stdin as a fresh interpreter has them."""
    forked = probe(tmp_path, how)
    fresh = probe(tmp_path, how, JAX_DEBUG_NANS="0")  # a JAX variable of its own: no zygote
    assert forked.pop("preloaded") and not fresh.pop("preloaded")
    assert forked == fresh
    assert forked["ppid"] == os.getpid() and forked["stdin"] == "from stdin"
    assert forked["env"] == "42" and forked["name"] == "__main__"


def test_a_changed_environment_of_this_process_gets_a_zygote_of_its_own(tmp_path, monkeypatch):
    """A variable read at import set here (as a session fixture does) is seen by the children
    through a zygote started with it; set for one child only, that child starts fresh."""
    monkeypatch.setenv("TF_CPP_VMODULE", "probe=1")
    forked = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; print('jax' in sys.modules, os.environ['TF_CPP_VMODULE'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert forked.stdout.split() == ["True", "probe=1"]
    assert not probe(tmp_path, "-c", TF_CPP_VMODULE="other=1")["preloaded"]
    assert not probe(tmp_path, "-c", JAXJOB_TEST_ZYGOTE="0")["preloaded"]


@pytest.mark.parametrize("configure_first", [True, False])
def test_logging_is_configured_as_in_a_fresh_interpreter(configure_first):
    """Orbax's import gives the root logger a handler only if the program has not configured
    logging before importing it, in a forked child as in a fresh one."""
    code = (
        "import logging\n"
        + ("logging.basicConfig(level=logging.INFO)\n" if configure_first else "")
        + "print(len(logging.root.handlers), logging.root.level)\n"
        + "import orbax.checkpoint\n"
        + "print(len(logging.root.handlers), logging.root.level)\n"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, **env},
        ).stdout
        for env in ({}, {"JAXJOB_TEST_ZYGOTE": "0"})
    ]
    assert runs[0] == runs[1]
    assert runs[0].split("\n")[1] == ("1 20" if configure_first else "1 30")


def test_exit_status_traceback_and_sigkill_are_a_processs_own():
    """Exit codes, an uncaught exception's traceback and SIGKILL reach the Popen as usual."""
    assert subprocess.run([sys.executable, "-c", "raise SystemExit(3)"]).returncode == 3
    out = subprocess.run([sys.executable, "-c", "1/0"], capture_output=True, text=True)
    assert out.returncode == 1 and out.stderr.splitlines()[-1].startswith("ZeroDivisionError")
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    assert os.getpgid(child.pid) == child.pid  # a session and process group of its own
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=10) == -signal.SIGKILL


def test_atexit_handlers_run_and_random_state_is_fresh():
    """A child exits as python does (atexit runs) and draws its own random numbers."""
    code = "import atexit, random; atexit.register(print, 'bye'); print(random.random())"
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    assert all(r.stdout.splitlines()[-1] == "bye" for r in runs)
    assert runs[0].stdout.splitlines()[0] != runs[1].stdout.splitlines()[0]


def test_an_adopted_orphan_is_reaped():
    """A grandchild orphaned by its parent is adopted by this process and reaped, as by init."""
    code = (
        "import subprocess, sys; p = subprocess.Popen(['sleep', '0.3']); print(p.pid, flush=True)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    orphan = int(out.stdout)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{orphan}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{orphan}"), "the orphan was left a zombie"
