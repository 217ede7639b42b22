"""The documentation site (docs/): every example in it runs, and it builds with no warning.

Every Python example of the site is a ``{code-cell}`` of a MyST notebook page, which myst-nb
executes at every build (``nb_execution_mode = "force"``), each page in a fresh temporary
directory, a cell that raises failing the build (``nb_execution_raise_on_error``). So the build
is the test of the examples: the outputs on the pages are the ones the build produced. The
fast tests here check that no Python example escapes that (a plain ``python`` fence, a page
that is not a notebook); the slow one builds the site with ``-W``.
"""

import ast
import glob
import os
import re
import shutil
import subprocess
import sys
import time

import paths
import pytest

DOCS = os.path.join(paths.ROOT, "docs")
FENCE = re.compile(r"^(`{3,}|~{3,})\s*(\{[\w-]+\}|[\w+-]*)", re.M)
PYTHON_FENCES = {"python", "py", "python3", "ipython", "ipython3", "pycon", "{code-block}"}


def _pages():
    pages = glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True)
    return sorted(p for p in pages if os.sep + "_build" + os.sep not in p)


def _fences(text):
    """The info string of every opening fence (the closing ones have none)."""
    found, open_fence = [], None
    for match in FENCE.finditer(text):
        marks, info = match.group(1), match.group(2)
        if open_fence is None:
            found.append(info)
            open_fence = marks
        elif marks.startswith(open_fence) and not info:
            open_fence = None
    return found


def _conf():
    """docs/conf.py's top-level assignments of literals."""
    with open(os.path.join(DOCS, "conf.py")) as f:
        tree = ast.parse(f.read())
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                try:
                    values[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    continue
    return values


def test_the_site_has_its_pages():
    """Every page the issue asks for exists."""
    names = {os.path.relpath(p, DOCS) for p in _pages()}
    pages = "index getting-started concepts coming-from-orbax coming-from-lightning reliability"
    pages += " performance cli api format guides/eval guides/data guides/multiprocess"
    pages += " guides/cloud guides/two-tiers guides/long-runs contributing"
    for page in pages.split():
        assert f"{page}.md" in names, f"docs/{page}.md is missing"


@pytest.mark.parametrize("page", [os.path.relpath(p, DOCS) for p in _pages()])
def test_every_python_example_is_an_executed_cell(page):
    """A page's Python is in {code-cell} blocks of a MyST notebook, which the build executes;
    shell, YAML and text blocks are shown, not run."""
    with open(os.path.join(DOCS, page)) as f:
        text = f.read()
    fences = _fences(text)
    plain = [f for f in fences if f in PYTHON_FENCES]
    assert not plain, f"docs/{page}: {plain} blocks are not executed; use {{code-cell}} ipython3"
    if "{code-cell}" in fences:
        assert text.startswith("---\nfile_format: mystnb\n"), (
            f"docs/{page} has {{code-cell}} blocks but no 'file_format: mystnb' front matter: "
            "myst-nb would not execute them"
        )


def test_the_build_executes_every_page_and_fails_on_errors():
    """conf.py: every notebook page runs at every build, in a temporary directory of its own,
    and an exception in a cell fails the build."""
    conf = _conf()
    assert conf["nb_execution_mode"] == "force"
    assert conf["nb_execution_raise_on_error"] is True
    assert conf["nb_execution_in_temp"] is True


def test_the_docs_name_no_private_module():
    """No page names jaxjob's private package: users read public names only."""
    for page in _pages():
        with open(page) as f:
            text = f.read()
        assert not re.search(r"jaxjob[./]_src", text), f"{page} names a private module"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_site_builds_with_no_warning_and_leaves_nothing_behind(tmp_path):
    """sphinx-build -W --keep-going: every page executed, the API reference generated from the
    docstrings, the performance plots drawn from benchmarks/results.json; the temporary
    directories of the executed pages are removed."""
    pytest.importorskip("myst_nb", reason="the docs build needs pip install -e '.[docs]'")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    html = tmp_path / "html"
    env = {**os.environ, "TMPDIR": str(scratch), "JAXJOB_TEST_ZYGOTE": "0"}
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    command += ["-d", str(tmp_path / "doctrees"), DOCS, str(html)]
    start = time.perf_counter()
    build = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1700)
    seconds = time.perf_counter() - start
    assert build.returncode == 0, build.stdout[-5000:] + build.stderr[-20000:]
    print(f"docs built in {seconds:.0f} s")
    with open(html / "getting-started.html") as f:
        started = f.read()
    assert "KeyboardInterrupt" in started and "epoch 40" in started  # Ctrl-C, then resumed
    with open(html / "performance.html") as f:
        assert f.read().count('<img alt="_images/') >= 6  # the plots
    with open(html / "api.html") as f:
        api = f.read()
    assert 'id="jaxjob.CheckpointManager"' in api and 'id="jaxjob.keep.Last"' in api
    assert "_src" not in api  # public names only, in text, signatures and link titles
    assert not os.listdir(scratch), os.listdir(scratch)  # nothing left in TMPDIR
    shutil.rmtree(html)
