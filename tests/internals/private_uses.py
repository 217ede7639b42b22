"""What jaxjob's sources use of Orbax's, JAX's and TensorStore's internals, read with ``ast``.

``test_orbax_contract`` checks each use found here against its table of private names. A use is
a name reached through an import whose path has a private part (``orbax.checkpoint._src...``,
``jax._src...``, ``x._y``) or lies in ``jax.extend`` or ``jaxlib``; an override of, or a
``self._x`` read from, an Orbax or JAX class that jaxjob subclasses; a module attribute that
jaxjob assigns (a replaced function); the keywords of a call to a private function; and Orbax's
file names spelled out in jaxjob's strings.
"""

import ast
import dataclasses
import importlib
import re
from typing import Any

THIRD_PARTY = ("orbax", "jax", "jaxlib", "tensorstore")

# Kinds of use (the last four are also kinds of the contract table's rows)
REFERENCE = "reference"  # an import, or a name reached through one
CALL = "call"  # a call's keywords
LITERAL = "literal"  # an Orbax file name spelled out
OVERRIDE = "override"  # jaxjob's subclass redefines it: its parameters must be exactly upstream's
ATTRIBUTE = "instance attribute"  # read by jaxjob's subclass (``self._x``)
BASE = "base class"  # jaxjob subclasses it (with overrides or reads, or a private one)
REPLACED = "replaced function"  # jaxjob assigns its own to the module attribute


@dataclasses.dataclass(frozen=True)
class Found:
    """A private use in jaxjob's sources; ``kind``: REFERENCE, CALL, LITERAL or a row kind."""

    dotted: str
    kind: str
    file: str  # relative to the package
    line: int
    params: tuple[str, ...] = ()  # an override's parameters; the keywords of a call


def _is_private(dotted: str) -> bool:
    """Whether ``dotted`` (resolved through imports) is an Orbax, JAX or TensorStore internal."""
    parts = dotted.split(".")
    hidden = any(p.startswith("_") and not p.startswith("__") for p in parts)
    return parts[0] in THIRD_PARTY and (
        hidden or parts[:2] == ["jax", "extend"] or parts[0] == "jaxlib"
    )


def _aliases(nodes: list[ast.AST]) -> dict[str, str]:
    """Local name -> the Orbax, JAX or TensorStore module or name it is bound to by an import."""
    names = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {
                a.asname or a.name.split(".")[0]: a.name if a.asname else a.name.split(".")[0]
                for a in node.names
            }
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
    return {k: v for k, v in names.items() if v.split(".")[0] in THIRD_PARTY}


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """``a.b.c`` with ``a`` resolved through ``aliases``; None if ``a`` is not an import."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in aliases:
        return ".".join([aliases[node.id], *reversed(parts)])
    return None


def _import_dotted(dotted: str) -> Any:
    """The object at ``dotted``; None if it is gone (the contract's own row then says so)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part, None)
        return obj
    return None


def _parameters(method: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    """A method's parameter names, without ``self``."""
    args = method.args
    return tuple(a.arg for a in args.posonlyargs + args.args + args.kwonlyargs)[1:]


def _subclass_uses(cls: ast.ClassDef, aliases: dict[str, str], file: str) -> list[Found]:
    """Overrides of, and ``self._x`` reads from, the Orbax or JAX class ``cls`` subclasses."""
    bases = [d for d in (_dotted(b, aliases) for b in cls.bases) if d]
    if not bases:
        return []
    base, upstream = bases[0], _import_dotted(bases[0])
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    own = {n.name for n in methods} | {
        t.attr if isinstance(t, ast.Attribute) else getattr(t, "id", None)
        for n in ast.walk(cls)
        if isinstance(n, ast.Assign | ast.AnnAssign)
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
    }
    found = [
        Found(f"{base}.{m.name}", OVERRIDE, file, m.lineno, _parameters(m))
        for m in methods
        if not m.name.startswith("__") and hasattr(upstream, m.name)
    ]
    found += [
        Found(f"{base}.{n.attr}", ATTRIBUTE, file, n.lineno)
        for n in ast.walk(cls)
        if isinstance(n, ast.Attribute)
        and getattr(n.value, "id", None) == "self"
        and n.attr.startswith("_")
        and not n.attr.startswith("__")
        and n.attr not in own
    ]
    return found + ([Found(base, BASE, file, cls.lineno)] if found or _is_private(base) else [])


def _literals(nodes: list[ast.AST], file: str, names: dict[str, str]) -> list[Found]:
    """Where jaxjob spells out one of ``names`` (value -> upstream name) itself (not docstrings)."""
    if not names:
        return []
    pattern = re.compile("|".join(rf"(?<!\w){re.escape(v)}(?!\w)" for v in names), re.I)
    lower = {v.lower(): dotted for v, dotted in names.items()}
    docs = {id(n.value) for n in nodes if isinstance(n, ast.Expr)}
    return [
        Found(lower[match.group().lower()], LITERAL, file, node.lineno)
        for node in nodes
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
        for match in pattern.finditer(node.value.replace("\\.", "."))  # a regex's \.
    ]


def uses_in(source: str, file: str, names: dict[str, str]) -> list[Found]:
    """Every private use of Orbax, JAX or TensorStore in ``source``, jaxjob's ``file``.

    Args:
        source: The text of a jaxjob module.
        file: Its path, relative to the package (``_src/internals/orbax_commit.py``).
        names: Orbax's file names that jaxjob may spell out itself -> their upstream names.
    """
    nodes = list(ast.walk(ast.parse(source)))
    aliases, found = _aliases(nodes), _literals(nodes, file, names)
    inner = {id(n.value) for n in nodes if isinstance(n, ast.Attribute)}
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom) and not getattr(node, "level", 0):
            prefix = f"{node.module}." if isinstance(node, ast.ImportFrom) else ""
            found += [Found(prefix + a.name, REFERENCE, file, node.lineno) for a in node.names]
        elif isinstance(node, ast.Attribute) and id(node) not in inner and _dotted(node, aliases):
            kind = REPLACED if isinstance(node.ctx, ast.Store) else REFERENCE
            found.append(Found(_dotted(node, aliases), kind, file, node.lineno))
        elif isinstance(node, ast.Call) and node.keywords and _dotted(node.func, aliases):
            keywords = tuple(k.arg for k in node.keywords if k.arg)
            found.append(Found(_dotted(node.func, aliases), CALL, file, node.lineno, keywords))
        elif isinstance(node, ast.ClassDef):
            found += _subclass_uses(node, aliases, file)
    return [
        f for f in found if _is_private(f.dotted) or f.kind in (OVERRIDE, ATTRIBUTE, BASE, LITERAL)
    ]
