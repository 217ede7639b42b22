"""Where the tests find the repository (its README, examples, notebooks) and the job scripts."""

import os

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
JOBS = os.path.join(TESTS, "jobs")  # the child-process job scripts
DOCS = os.path.join(ROOT, "docs")


def docs_cells(page, heading):
    """The sources of the ``{code-cell}`` blocks of ``docs/<page>`` under ``heading``.

    Args:
        page: the page's path under docs/, e.g. ``"guides/eval.md"``.
        heading: a heading's text without its ``#`` marks; its section runs to the next heading
            of the same or a higher level.

    Returns:
        Each cell's source in page order, its option lines (``:tags: ...``) left out.

    Raises:
        ValueError: the page has no such heading.
    """
    with open(os.path.join(DOCS, page)) as f:
        lines = f.read().split("\n")
    level, section, fence = None, [], None
    for line in lines:
        marks = len(line) - len(line.lstrip("#"))
        if fence is None and marks > 0 and line[marks : marks + 1] == " ":  # a heading
            if level is not None and marks <= level:
                break
            if level is None and line[marks + 1 :].strip() == heading:
                level = marks
                continue
        elif line.startswith("```"):
            ticks = line[: len(line) - len(line.lstrip("`"))]
            if fence is None:
                fence = ticks
            elif ticks == fence and not line.strip("`").strip():
                fence = None
        if level is not None:
            section.append(line)
    if level is None:
        raise ValueError(f"docs/{page} has no heading {heading!r}")
    return _cells(section)


def _cells(lines):
    """The ``{code-cell}`` sources among ``lines`` (option lines left out)."""
    cells, current = [], None
    for line in lines:
        if current is None:
            if line.startswith("```{code-cell}"):
                current = []
        elif line.rstrip() == "```":
            cells.append("\n".join(current).lstrip("\n") + "\n")
            current = None
        elif current or not line.startswith(":"):
            current.append(line)
    return cells
