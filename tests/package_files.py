"""The package's source files, for the tests that must read every one of them.

The source audit, the fail-point scan and the doctest walk each assert that they saw
:data:`PY_FILES` files (or the modules they make), so a move that hides a module from one of them
fails it; adding a module means changing this one number (and, under ``_src``, the layer test's).
"""

import os

import jaxjob

JAXJOB = os.path.dirname(jaxjob.__file__)
PY_FILES = 135  # the .py files under jaxjob/, recursively


def py_files(root: str = JAXJOB) -> list[str]:
    """Every .py file under ``root``, relative to it and sorted (``_src/base/fs.py``)."""
    found = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        paths = [os.path.join(directory, f) for f in files if f.endswith(".py")]
        found += [os.path.relpath(p, root) for p in paths]
    return sorted(found)
