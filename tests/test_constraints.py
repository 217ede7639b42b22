"""CI installs reproducibly: constraints.txt (the newest set) and constraints-lowest.txt (the
lowest) pin everything jaxjob[test] needs, and no torch."""

import os
import re

import paths
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = paths.ROOT


CONSTRAINTS = ["constraints.txt", "constraints-lowest.txt"]


def _pins(name="constraints.txt"):
    pins = {}
    with open(os.path.join(ROOT, name)) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                name, version = line.split("==")
                pins[canonicalize_name(name)] = version
    return pins


def _required():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    return [
        Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]
    ]


@pytest.mark.parametrize("constraints", CONSTRAINTS)
def test_every_core_and_test_requirement_is_pinned_within_its_range(constraints):
    """Each requirement of jaxjob and of [test] has an exact pin that its specifier allows."""
    pins = _pins(constraints)
    for req in _required():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in {constraints}"
        assert req.specifier.contains(pins[name], prereleases=True), (req, pins[name])


def test_the_lowest_set_pins_each_lower_bound():
    """constraints-lowest.txt pins jaxjob's requirements, flax and grain at their ranges' bottom."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    test = [r for r in project["optional-dependencies"]["test"] if r.startswith(("flax", "grain"))]
    pins = _pins("constraints-lowest.txt")
    for req in map(Requirement, project["dependencies"] + test):
        low = next(s.version for s in req.specifier if s.operator == ">=")
        pinned = pins[canonicalize_name(req.name)]
        assert Version(pinned) == Version(low), f"{req} is pinned at {pinned}, not {low}"


@pytest.mark.parametrize("constraints", CONSTRAINTS)
def test_torch_is_neither_pinned_nor_required_by_test(constraints):
    """torch stays out of the test install: not in [test], not in the constraints."""
    assert not {"torch", "nvidia-cublas-cu12", "triton"} & set(_pins(constraints))
    assert "torch" not in {canonicalize_name(r.name) for r in _required()}


def _readme_commands():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text[text.index("## Two commands") : text.index("## A job in 20 lines")]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_readme_has_two_commands_that_install_with_the_constraints():
    """The README's set-up is two commands, each installing with -c constraints.txt."""
    commands = _readme_commands()
    assert len(commands) == 2, commands
    assert "examples/digits.py" in commands[0] and "pytest" in commands[1]
    for command in commands:
        assert "\n" not in command, command
        assert command.startswith("python -m pip install -c constraints.txt -e "), command


def test_ci_runs_the_readme_commands_as_printed_in_a_new_venv():
    """.ci/run makes a new venv and runs the README's two commands verbatim, pip untouched first."""
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        lines = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    commands = _readme_commands()
    first = lines.index(commands[0])
    assert lines[first + 1] == commands[1]
    before = "\n".join(lines[:first])
    assert "python3 -m venv .venv" in before and ". .venv/bin/activate" in before
    assert "PIP_CONSTRAINT" not in before and not re.search(r"\bpip\b", before), before


def test_every_requirement_has_an_upper_bound():
    """No requirement is open-ended: a new release cannot break a fresh install."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    groups = {"core": project["dependencies"], **project["optional-dependencies"]}
    for group, requirements in groups.items():
        for text in requirements:
            specs = Requirement(text).specifier
            assert any(s.operator in ("<", "<=", "==", "~=") for s in specs), (group, text)
