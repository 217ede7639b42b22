"""CI installs reproducibly: constraints.txt pins everything jaxjob[test] needs, and no torch."""

import os

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pins():
    pins = {}
    with open(os.path.join(ROOT, "constraints.txt")) as f:
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


def test_every_core_and_test_requirement_is_pinned_within_its_range():
    """Each requirement of jaxjob and of [test] has an exact pin that its specifier allows."""
    pins = _pins()
    for req in _required():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (req, pins[name])


def test_torch_is_neither_pinned_nor_required_by_test():
    """torch stays out of the test install: not in [test], not in the constraints."""
    assert not {"torch", "nvidia-cublas-cu12", "triton"} & set(_pins())
    assert "torch" not in {canonicalize_name(r.name) for r in _required()}


def test_ci_installs_with_the_constraints_file():
    """.ci/run exports PIP_CONSTRAINT to the repository's constraints.txt before installing."""
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        script = f.read()
    assert 'export PIP_CONSTRAINT="$PWD/constraints.txt"' in script
    assert script.index("PIP_CONSTRAINT") < script.index("pip install")
