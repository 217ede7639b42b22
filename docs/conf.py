"""Sphinx configuration of jaxjob's documentation site.

Build (after ``pip install -e ".[docs]"``)::

    sphinx-build -W --keep-going -b html docs docs/_build/html

The pages are MyST Markdown; those with ``{code-cell}`` blocks are notebooks that myst-nb
executes at every build, each in a fresh temporary directory, and a cell that raises fails
the build. The API reference is generated from the docstrings (Google style).
"""

from __future__ import annotations

import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The executed pages read files of the repository (benchmarks/results.json, examples/)
# from here: they run in a temporary directory.
os.environ["JAXJOB_REPO"] = str(ROOT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

project = "jaxjob"
author = "jaxjob authors"
copyright = "2026, jaxjob authors"  # noqa: A001 (Sphinx's name)

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}

# MyST
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# myst-nb: every notebook page runs at every build, in a temporary directory of its own, and
# any error in a cell fails the build (a broken example is a broken build).
nb_execution_mode = "force"
nb_execution_in_temp = True
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_execution_timeout = 300
nb_merge_streams = True

# autodoc + napoleon (Google-style docstrings)
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

html_theme = "sphinx_book_theme"
html_title = "jaxjob"
html_theme_options = {
    "show_toc_level": 2,
    "navigation_with_keys": False,
}
html_static_path: list[str] = []


# --- Public names only ---------------------------------------------------------------------------
# The public objects are defined in jaxjob's private package and re-exported (jaxjob.<name>,
# jaxjob.<module>.<name>). Autodoc documents them under their public path (docs/api.md), but
# renders annotations and base classes by where they are defined; these hooks show the public
# path instead, and leave out private base classes.


def _public_paths() -> dict[str, str]:
    """``<defining module>.<qualname>`` -> the public path, for every public object."""
    import types

    import jaxjob

    found: dict[str, str] = {}

    def add(obj: object, public: str) -> None:
        module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if isinstance(module, str) and isinstance(qualname, str) and module != "jaxjob":
            found.setdefault(f"{module}.{qualname}", public)

    modules = [n for n in jaxjob.__all__ if isinstance(getattr(jaxjob, n), types.ModuleType)]
    for name in jaxjob.__all__:  # top-level names first: jaxjob.HostTimeoutError wins
        if name not in modules:
            add(getattr(jaxjob, name), f"jaxjob.{name}")
    for module in modules:
        for name in getattr(jaxjob, module).__all__:
            add(getattr(getattr(jaxjob, module), name), f"jaxjob.{module}.{name}")
    return found


def _is_private(cls: type) -> bool:
    return (
        cls.__module__.startswith("jaxjob._src")
        and f"{cls.__module__}.{cls.__qualname__}" not in PUBLIC
    )


def _public_bases(app, name, obj, options, bases) -> None:
    """Base classes: private ones are left out (their members are documented on the class)."""
    bases[:] = [b for b in bases if not (isinstance(b, type) and _is_private(b))]


def _public_text(app, doctree, docname) -> None:
    """Link titles and text that name an object by its defining module name it publicly."""
    from docutils import nodes

    for ref in doctree.findall(nodes.reference):
        title = ref.get("reftitle")
        if title in PUBLIC:
            ref["reftitle"] = PUBLIC[title]
    for text in list(doctree.findall(nodes.Text)):
        if "jaxjob._src." in text:
            value = str(text)
            for private, public in PUBLIC.items():
                value = value.replace(private, public)
            text.parent.replace(text, nodes.Text(value))


PUBLIC = _public_paths()


def setup(app):
    """Registers the hooks above."""
    app.connect("autodoc-process-bases", _public_bases)
    app.connect("doctree-resolved", _public_text)
