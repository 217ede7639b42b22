"""The fence around Orbax's and JAX's internals: each private name jaxjob relies on still holds.

jaxjob reaches past the public APIs of Orbax and JAX in a few places (``jaxjob/_src/internals/``
says why, each time). :data:`FENCE` lists every such name, one row each: where it lives upstream,
what jaxjob takes it for (``kind``), what jaxjob uses it for and which jaxjob modules depend on
it. ``test_fence_holds`` checks each row against the installed Orbax and JAX, so an upgrade that
moves one fails here, naming it and its users, instead of wherever it is first used;
``test_every_private_use_is_fenced`` reads jaxjob's sources (``ast``) so that a private use
without a row (an import, a ``self._x`` of an Orbax subclass, an override, a replaced function,
a duplicated file name) fails too.

Rows hold for every release in pyproject.toml's ranges (orbax-checkpoint 0.12.1-0.12.x, jax
0.8-0.10; 0.12.1-0.12.2 lack ``ocp.options.AtomicityOptions``: the ``AtomicityOptions`` row, and
``orbax_commit.composite_commit_options`` chooses the commit-file class there instead). Where
a name differs between them, its row says so, naming the release: ``before`` gives where (or
that) the name is in older releases, and ``sha`` the releases each reviewed code hash is from.
"""

import ast
import dataclasses
import functools
import hashlib
import importlib
import inspect
import os
import re
import textwrap
from importlib import metadata
from typing import Any

import package_files
import pytest
from etils import epath
from packaging.version import Version
from private_uses import ATTRIBUTE, BASE, CALL, OVERRIDE, REPLACED, Found, uses_in

# Kinds of row: what jaxjob takes the name for, which says how it is checked. The source scan
# finds four of them itself (private_uses.py): OVERRIDE (jaxjob's subclass redefines it: ``params``
# must be exactly upstream's), ATTRIBUTE (read by jaxjob's subclass: checked on an instance,
# INSTANCES), BASE (subclassed) and REPLACED (jaxjob assigns its own to the module attribute).
MODULE = "module"  # imported
NAME = "name"  # a module-level object or constant (``value``: what jaxjob assumes it is)
FUNCTION = "function"  # called with ``params`` (in upstream order)
METHOD = "method"  # called on an instance Orbax or JAX makes, with ``params``
CLASS = "class"  # an isinstance target
FIELD = "field"  # a dataclass field, annotation, constructor parameter or property


@dataclasses.dataclass(frozen=True)
class Use:
    """One private name jaxjob relies on: ``where`` is ``module:qualified.name`` upstream."""

    where: str
    kind: str
    used_for: str
    users: tuple[str, ...]  # jaxjob modules, relative to the package (``_src/...``)
    params: tuple[str, ...] = ()  # the parameters jaxjob passes or declares (without self)
    value: Any = None  # what jaxjob assumes the name is (a file name jaxjob also writes)
    # the upstream code jaxjob copied or re-implemented, reviewed: (code hash, the releases)
    sha: tuple[tuple[str, str], ...] = ()
    # (release, where): in releases before ``release`` the name is at ``where`` instead
    # (None: it is not there, and jaxjob does without it), oldest ``release`` first
    before: tuple[tuple[str, str | None], ...] = ()

    @property
    def dotted(self) -> str:
        return self.where.replace(":", ".")


# fmt: off
# jaxjob's modules (users), relative to the package
OC, OK, OR = "_src/internals/orbax_commit.py", "_src/internals/orbax_kvstore.py", "_src/internals/orbax_reads.py"  # noqa: E501
OH, OF, RB = "_src/internals/orbax_handlers.py", "_src/internals/orbax_files.py", "_src/internals/restore_buffers.py"  # noqa: E501
JP, FT, LAYOUT = "_src/base/jax_private.py", "_src/base/file_table.py", "_src/checkpoint/layout.py"  # noqa: E501
NAMES, FILES = "_src/checkpoint/stored_names.py", "_src/checkpoint/files.py"
CHECKSUM = "_src/checkpoint/checksum.py"
RETENTION, TARGETS = "_src/manager/retention/leftovers.py", "_src/run/targets.py"
HOSTS, DIST = "_src/multihost/hosts.py", "_src/multihost/distributed.py"
# upstream modules and classes
ATOM, TYPES = "orbax.checkpoint._src.path.atomicity", "orbax.checkpoint._src.path.atomicity_types"
RENAME, COMMIT = f"{ATOM}:AtomicRenameTemporaryPath", f"{ATOM}:CommitFileTemporaryPath"
ASYNC, STEP = "orbax.checkpoint._src.path.async_path", "orbax.checkpoint._src.metadata.checkpoint"
FORMAT, SHARDING = "orbax.checkpoint._src.path.format_utils", "orbax.checkpoint._src.metadata.sharding"  # noqa: E501
SER, TSU = "orbax.checkpoint._src.serialization.serialization", "orbax.checkpoint._src.serialization.tensorstore_utils"  # noqa: E501
PROCESS, LOOPS = "orbax.checkpoint._src.serialization.ocdbt_process_spec", "orbax.checkpoint._src.asyncio_utils"  # noqa: E501
NUMPY, INFO = "orbax.checkpoint:type_handlers.NumpyHandler", "orbax.checkpoint:type_handlers.ParamInfo"  # noqa: E501
JSON, COMPOSITE = "orbax.checkpoint:JsonCheckpointHandler", "orbax.checkpoint:CompositeCheckpointHandler"  # noqa: E501
COMPOSITE_OPTIONS = "orbax.checkpoint:CompositeOptions"
FUTURE = "orbax.checkpoint._src.futures.future"
DISTRIBUTED, CLIENT = "jax._src.distributed", "jax._src.lib:_jax.DistributedRuntimeClient"
CORE = "jax.extend.core"
TMP_ATTRS = ("_tmp_path", "_final_path", "_checkpoint_metadata_store")

FENCE = [
    # the durable commit (DurableRename) and the commit file on object stores (TabledCommitFile)
    Use(ATOM, MODULE, "Orbax's commit classes", (OC,)),
    Use(f"{ATOM}:COMMIT_SUCCESS_FILE", NAME, "the commit marker, written and read",
        (OC, FT, LAYOUT, NAMES, FILES), value="commit_success.txt"),
    Use(RENAME, BASE, "DurableRename: every file and the rename fsynced", (OC,)),
    Use(f"{RENAME}.create", OVERRIDE, "marks the directory flushed at the commit", (OC,)),
    Use(f"{RENAME}.finalize", OVERRIDE, "re-implemented: table, fsyncs, marker, rename; "
        "MarkedRename (0.12.1-0.12.2): the item marker, then Orbax's", (OC,),
        sha=(("64ab5f71442deb68", "0.12.1-0.12.2: no item marker: MarkedRename"),
             ("bdf4911434ad1211", "0.12.3+"))),
    *(Use(f"{RENAME}.{a}", ATTRIBUTE, "read by DurableRename's commit", (OC,)) for a in TMP_ATTRS),
    Use(COMMIT, BASE, "TabledCommitFile: the file table before the marker", (OC,)),
    # public, but only from 0.12.3: before it orbax_commit chooses the commit-file class itself
    Use("orbax.checkpoint:options.AtomicityOptions", CLASS, "commit-file mode on object stores",
        (OC,), before=(("0.12.3", None),)),
    Use(f"{COMPOSITE_OPTIONS}.atomicity_options", FIELD, "the items' commit on object stores",
        (OC,), before=(("0.12.3", None),)),
    Use(f"{COMPOSITE_OPTIONS}.temporary_path_class", FIELD, "the same in 0.12.1-0.12.2", (OC,)),
    Use(f"{COMMIT}.finalize", OVERRIDE, "re-implemented: file table, then marker", (OC,),
        sha=(("4d0ce4555d115297", "0.12.3+"),)),
    *(Use(f"{COMMIT}.{a}", ATTRIBUTE, "read by TabledCommitFile's commit", (OC,)) for a in TMP_ATTRS),  # noqa: E501
    Use(TYPES, MODULE, "the temporary directory's suffix", (OC,)),
    Use(f"{TYPES}:TMP_DIR_SUFFIX", NAME, "the names of uncommitted saves", (OC, LAYOUT, RETENTION),
        value=".orbax-checkpoint-tmp"),
    Use(ASYNC, MODULE, "Orbax's async file operations", (OC, OH)),
    Use(f"{ASYNC}:rename", FUNCTION, "the commit's rename", (OC,), params=("src", "dst")),
    Use(f"{ASYNC}:write_text", FUNCTION, "a checksum file; MarkedRename's marker", (OH, OC),
        params=("path", "text")),
    # step metadata (start and commit times) and the other files Orbax names
    Use(STEP, MODULE, "the step metadata file", (OC,)),
    Use(f"{STEP}:step_metadata_file_path", FUNCTION, "where the commit time is", (OC,),
        params=("path",)),
    Use(f"{STEP}:MetadataStore.update", METHOD, "records the commit time", (OC,),
        params=("file_path",)),
    Use(f"{STEP}:MetadataStore.wait_until_finished", METHOD, "around that update", (OC,)),
    Use(f"{STEP}:StepMetadata.commit_timestamp_nsecs", FIELD, "written, read back", (OC, OF)),
    Use(f"{STEP}:StepMetadata.init_timestamp_nsecs", FIELD, "a checkpoint's start time", (OF,)),
    Use(f"{STEP}:_STEP_METADATA_FILENAME", NAME, "an Orbax file (file table, reserved names)",
        (FT, NAMES, FILES), value="_CHECKPOINT_METADATA"),
    Use(f"{STEP}:_ROOT_METADATA_FILENAME", NAME, "an Orbax file (file table, reserved names)",
        (FT, NAMES), value="_ROOT_METADATA"),
    Use(f"{FORMAT}:PYTREE_METADATA_FILE", NAME, "an Orbax file (file table, reserved names)",
        (FT, NAMES), value="_METADATA"),
    Use(f"{FORMAT}:OCDBT_MANIFEST_FILE", NAME, "an OCDBT database's root file",
        (FT, NAMES, CHECKSUM), value="manifest.ocdbt",
        before=(("0.12.2", f"{FORMAT}:_OCDBT_MANIFEST_FILE"),)),
    Use(f"{PROCESS}:PROCESS_PREFIX", NAME, "a process's OCDBT database (damaged leaf's files)",
        (CHECKSUM,), value="ocdbt.process_",
        before=(("0.12.5", f"{TSU}:PROCESS_SUBDIR_PREFIX"),)),
    Use(f"{SHARDING}:_SHARDING", NAME, "saved shardings, read by jaxjob", (OF, FT, NAMES),
        value="_sharding"),
    Use(f"{SHARDING}:ShardingTypes.NAMED_SHARDING.value", NAME, "read from _sharding", (OF,),
        value="NamedSharding"),
    Use(f"{SHARDING}:ShardingTypes.SINGLE_DEVICE_SHARDING.value", NAME, "read from _sharding",
        (OF,), value="SingleDeviceSharding"),
    # TensorStore specs (s3://, no per-file fsync, memmap reads); 64-byte aligned restore buffers
    Use(TSU, MODULE, "Orbax's TensorStore specs", (OK, OH)),
    Use(f"{TSU}:build_kvstore_tspec", REPLACED, "wrapped: s3://, no fsync in a commit, memmap",
        (OK,), params=("directory", "name")),
    Use(f"{TSU}:build_array_write_spec", FUNCTION, "_ThisProcessNumpyHandler's writes", (OH,),
        params=("info", "arg", "global_shape", "local_shape", "dtype", "use_ocdbt",
                "process_index", "metadata_key")),
    Use(f"{TSU}:ArrayWriteSpec.json", FIELD, "the spec _ThisProcessNumpyHandler opens", (OH,)),
    Use(SER, MODULE, "Orbax's shard reader", (OR,)),
    Use(f"{SER}:_read_shard", REPLACED, "copied: restore_buffers.read_shard, aligned", (OR, RB),
        params=("t", "new_shard_shape", "dtype", "requested_domain", "restricted_domain"),
        sha=(("ab414eae47d50d1c", "0.12.1-0.12.2: casts on the loop; same values"),
             ("f36e73bdeac2cc4e", "0.12.3+"))),
    # Orbax's per-call event loops: closed only once no read is left in flight
    Use(LOOPS, MODULE, "Orbax's synchronous runs of its coroutines", (OR,)),
    Use(f"{LOOPS}:_run_sync_via_new_loop", REPLACED, "copied: _run_to_the_end, idle first",
        (OR,), params=("coro",), sha=(("f2142da66adf46fd", "0.12.5+"),),
        before=(("0.12.5", None),)),  # 0.12.1-0.12.4: asyncio.run, nothing to replace
    # handlers: checksum files (ManifestHandler), private saves, the save's fail points
    Use(JSON, BASE, "ManifestHandler", (OH,)),
    Use(f"{JSON}._save_fn", OVERRIDE, "each process's checksum file", (OH,),
        params=("x", "directory")),
    Use(NUMPY, BASE, "_ThisProcessNumpyHandler: written by the calling process", (OH,)),
    Use(f"{NUMPY}._background_serialize", OVERRIDE, "re-implemented: this process writes", (OH,),
        params=("values", "infos", "args"),
        sha=(("3742e381ff136d47", "0.12.1-0.12.2: a plain gather, as jaxjob's"),
             ("db21e147ebfa1843", "0.12.3+"))),
    Use(f"{NUMPY}._metadata_key", ATTRIBUTE, "passed to build_array_write_spec", (OH,)),
    Use(f"{NUMPY}._open_and_write", METHOD, "writes one array", (OH,),
        params=("value", "tspec", "ts_context")),
    Use(f"{INFO}.await_path_creation", METHOD, "before each write", (OH,)),
    Use(f"{INFO}.ts_context", FIELD, "each write's TensorStore context", (OH,)),
    Use(COMPOSITE, BASE, "CompositeHandler: the save's fail points", (OH,)),
    Use(f"{COMPOSITE}.async_save", OVERRIDE, "futures it returns are waited on in order",
        (OH,), params=("directory", "args")),
    Use(FUTURE, MODULE, "Orbax's futures", (OH,)),
    Use(f"{FUTURE}:ChainedFuture", CLASS, "opened: a failed save's writes all waited for", (OH,)),
    Use(f"{FUTURE}:ChainedFuture._futures", ATTRIBUTE, "a chained future's members", (OH,)),
    # JAX: the coordination-service client, the process index before a backend, jaxprs
    Use(DISTRIBUTED, MODULE, "jax.distributed's state", (JP,)),
    Use(f"{DISTRIBUTED}:global_state", NAME, "the client and the process id", (JP,)),
    Use(f"{DISTRIBUTED}:State.client", FIELD, "jaxjob's cross-process waits", (JP,)),
    Use(f"{DISTRIBUTED}:State.process_id", FIELD, "the [process=i] log prefix", (JP,)),
    Use(f"{CLIENT}.key_value_set", METHOD, "posts; leaving", (HOSTS, DIST),
        params=("key", "value")),
    Use(f"{CLIENT}.key_value_delete", METHOD, "old posts", (HOSTS,), params=("key",)),
    Use(f"{CLIENT}.key_value_dir_get", METHOD, "every process's post", (HOSTS,), params=("key",)),
    Use(f"{CLIENT}.wait_at_barrier", METHOD, "exchanges (a timeout in ms)", (HOSTS,),
        params=("barrier_id", "timeout_in_ms")),
    Use(f"{CLIENT}.blocking_key_value_get", METHOD, "waits at exit (ms)", (DIST,),
        params=("key", "timeout_in_ms")),
    Use(f"{CLIENT}.get_live_nodes", METHOD, "who is still connected at exit", (DIST,),
        params=("process_ids",)),
    Use("jax.sharding:NamedSharding.check_compatible_aval", METHOD,
        "a restore's sharding fits its leaf (JAX 0.8.0-0.8.1 skip it)", (JP,),
        params=("aval_shape",)),
    Use(f"{CORE}:ClosedJaxpr", CLASS, "the meshes a step's jaxpr names", (TARGETS,)),
    Use(f"{CORE}:ClosedJaxpr.jaxpr", FIELD, "its jaxpr", (TARGETS,)),
    Use(f"{CORE}:Jaxpr", CLASS, "the meshes a step's jaxpr names", (TARGETS,)),
    Use(f"{CORE}:Jaxpr.eqns", FIELD, "its equations", (TARGETS,)),
    Use(f"{CORE}:JaxprEqn.params", FIELD, "an equation's shardings", (TARGETS,)),
]
# fmt: on
# Orbax's file and directory names (a value with "." or "_"), which jaxjob's strings may spell out
FILE_NAMES = {u.value: u.dotted for u in FENCE if re.search(r"[._]", str(u.value or ""))}


# How an instance of a class with ATTRIBUTE rows is made (instance attributes are set in __init__).
_TMP, _FINAL = epath.Path("/nonexistent/x.orbax-checkpoint-tmp"), epath.Path("/nonexistent/x")
INSTANCES = {
    RENAME.split(":")[1]: lambda cls: cls(_TMP, _FINAL),
    COMMIT.split(":")[1]: lambda cls: cls(_FINAL, _FINAL),
    NUMPY.split(":")[1]: lambda cls: cls(),
    "ChainedFuture": lambda cls: cls([], cb=lambda: None),
}


# ---- checking a row against the installed versions ----------------------------------------


def _resolve(use: Use, upto: int = 0) -> Any:
    """The object at ``use.where`` (without its last ``upto`` names)."""
    module, _, qualname = use.where.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split(".")[: len(qualname.split(".")) - upto] if qualname else []:
        obj = getattr(obj, part)
    return obj


def _parameters(func: Any) -> list[str]:
    """``func``'s parameter names without ``self`` (nanobind methods: from their signature text)."""
    try:
        names = list(inspect.signature(func).parameters)
    except ValueError:  # a compiled method
        text = func.__nb_signature__[0][0]
        inside, depth, parts = text[text.index("(") + 1 :], 0, [""]
        for char in inside:
            depth += char in "[(" or -(char in "])")
            if depth < 0:
                break
            parts[-1:] = [parts[-1], ""] if char == "," and depth == 0 else [parts[-1] + char]
        names = [re.split(r"[:=]", p)[0].strip().lstrip("*") for p in parts if p.strip()]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def _code_hash(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """A hash of a function's code: its syntax tree without its docstring (nor comments)."""
    body = node.body[1:] if ast.get_docstring(node, clean=False) is not None else node.body
    parts = [node.args, *node.decorator_list, *body]
    return hashlib.sha256("\n".join(map(ast.dump, parts)).encode()).hexdigest()[:16]


def _definition(obj: Any) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(obj))).body[0]


def _original(use: Use) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """A replaced function as its module defines it: jaxjob's ``install`` may have replaced it."""
    module, _, name = use.where.partition(":")
    tree = ast.parse(inspect.getsource(importlib.import_module(module)))
    defs = (n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
    return next((n for n in defs if n.name == name), None)


def _replaced_problems(use: Use) -> list[str]:
    """Whether a replaced function is still defined, called, looked up as jaxjob assumes."""
    node = _original(use)
    if node is None:
        return ["is no longer defined by its module"]
    args = node.args
    upstream = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    return _signature_problems(use, upstream) + _hash_problems(use, node) + _lookup_problems(use)


def _hash_problems(use: Use, node: ast.AST) -> list[str]:
    if not use.sha or _code_hash(node) in dict(use.sha):
        return []
    reviewed = ", ".join(f"{h} ({releases})" for h, releases in use.sha)
    return [
        f"changed upstream (code hash {_code_hash(node)}, reviewed: {reviewed}):"
        " review jaxjob's copy against it, then record the new hash in FENCE"
    ]


def _has_field(cls: Any, name: str) -> bool:
    """Whether instances of ``cls`` have ``name``: a class attribute, annotation or parameter."""
    if hasattr(cls, name) or any(name in getattr(k, "__annotations__", {}) for k in cls.__mro__):
        return True
    return name in _parameters(cls)


def _problems(use: Use) -> list[str]:
    """What no longer holds of ``use`` in the installed versions (empty: all of it holds)."""
    *_, last = use.where.replace(":", ".").split(".")
    try:
        owner = _resolve(use, upto=1) if use.kind in (ATTRIBUTE, FIELD) else None
        obj = None if owner is not None else _resolve(use)
    except (ImportError, AttributeError) as err:
        return [f"no longer exists ({type(err).__name__}: {err})"]
    if use.kind == ATTRIBUTE:
        try:
            instance = INSTANCES[use.where.split(":")[1].rpartition(".")[0]](owner)
        except TypeError as err:  # its constructor changed: the attribute cannot be looked for
            return [f"cannot be looked for: {owner.__name__} is no longer made that way ({err})"]
        return [] if hasattr(instance, last) else ["is no longer set on its instances"]
    if use.kind == FIELD:
        return [] if _has_field(owner, last) else ["is no longer a field of its class"]
    if use.kind == REPLACED:
        return _replaced_problems(use)
    problems = []
    if use.value is not None and obj != use.value:
        problems.append(f"is now {obj!r}, not {use.value!r} (jaxjob writes or reads that name)")
    if use.kind in (BASE, CLASS) and not inspect.isclass(obj):
        problems.append(f"is no longer a class (it is {type(obj).__name__})")
    if use.kind in (FUNCTION, METHOD, OVERRIDE) and not callable(obj):
        problems.append("is no longer callable")
    elif use.kind in (FUNCTION, METHOD, OVERRIDE):
        problems += _signature_problems(use, _parameters(obj))
    return problems + (_hash_problems(use, _definition(obj)) if use.sha else [])


def _signature_problems(use: Use, upstream: list[str]) -> list[str]:
    """Whether the parameters jaxjob passes (in order) or declares still match ``upstream``."""
    exact = use.kind == OVERRIDE or (use.kind == REPLACED and use.sha)
    if exact and list(use.params) != upstream:
        return [
            f"now takes ({', '.join(upstream)}), not ({', '.join(use.params)}) as jaxjob's does"
        ]
    at = [upstream.index(p) for p in use.params if p in upstream]
    if len(at) != len(use.params) or at != sorted(at):
        return [f"now takes ({', '.join(upstream)}); jaxjob passes ({', '.join(use.params)})"]
    return []


@functools.cache
def _sources(package: str) -> tuple[tuple[str, str], ...]:
    """(path, text) of each non-test .py file of the installed ``package`` (read once)."""
    found = []
    for root in importlib.import_module(package).__path__:
        for directory, _, files in os.walk(root):
            for file in (f for f in files if f.endswith(".py") and not f.endswith("_test.py")):
                with open(os.path.join(directory, file), encoding="utf-8") as f:
                    found.append((os.path.join(directory, file), f.read()))
    return tuple(found)


def _lookup_problems(use: Use) -> list[str]:
    """A replaced function must be looked up on its module at each call, and still be called."""
    module, _, name = use.where.partition(":")
    by_name = re.compile(rf"^\s*from\s+[\w.]+\s+import\s+(\([^)]*|[^\n]*)\b{name}\b", re.M)
    call = re.compile(rf"(?<!def )\b{name}\(")
    texts = [(p, t) for p, t in _sources(module.split(".")[0]) if name in t]
    imported = [p for p, t in texts if by_name.search(t) and call.search(t)]  # re-exports aside
    problems = [
        f"is imported by name in {len(imported)} Orbax modules ({', '.join(imported[:2])}, ...):"
        " jaxjob's replacement misses their calls"
    ] if imported else []  # fmt: skip
    if not any(call.search(t) for _, t in texts):
        problems.append("is no longer called by Orbax: jaxjob's replacement does nothing")
    return problems


_DISTRIBUTIONS = {"orbax": "orbax-checkpoint", "jax": "jax", "jaxlib": "jaxlib"}


def _in_release(use: Use) -> tuple[Use | None, str]:
    """``use`` as the installed release spells it (None: not there), and which release that is."""
    package = _DISTRIBUTIONS[use.where.split(".")[0]]
    installed = metadata.version(package)
    for release, where in use.before:
        if Version(installed) < Version(release):
            row = dataclasses.replace(use, where=where, before=()) if where else None
            return row, f"{package} {installed} (before {release})"
    return use, f"{package} {installed}"


def _release_problems(use: Use) -> list[str]:
    """What no longer holds of ``use`` as the installed release should have it."""
    row, release = _in_release(use)
    if row is None:
        present = not _problems(dataclasses.replace(use, before=()))
        return [f"is defined in {release}, where FENCE says it is not"] if present else []
    problems = _problems(row)
    return [f"{'; '.join(problems)} (in {release}, at {row.where})"] if problems else []


@pytest.mark.parametrize("use", FENCE, ids=lambda use: f"{use.where}[{use.kind}]")
def test_fence_holds(use):
    """Each private name jaxjob relies on still exists and means what jaxjob assumes."""
    problems = _release_problems(use)
    users = ", ".join(f"jaxjob/{u}" for u in use.users)
    assert not problems, (
        f"{use.dotted} ({use.kind}) {'; '.join(problems)} (used by {users}: {use.used_for})"
    )


# ---- jaxjob's sources against FENCE --------------------------------------------------------


@functools.cache
def _all_uses() -> tuple[Found, ...]:
    """Every private use of Orbax, JAX or TensorStore in jaxjob (read once per test session)."""
    return tuple(f for file in package_files.py_files() for f in _uses(file))


def _uses(file: str) -> list[Found]:
    """Every private use of Orbax, JAX or TensorStore in jaxjob's ``file``."""
    with open(os.path.join(package_files.JAXJOB, file), encoding="utf-8") as f:
        return uses_in(f.read(), file, FILE_NAMES)


def _covers(use: Use, found: Found) -> bool:
    """Whether ``use`` is the row of ``found`` (or of a name under it, or the object it reads)."""
    return (
        use.dotted == found.dotted
        or use.dotted.startswith(found.dotted + ".")
        or (use.kind == NAME and found.dotted.startswith(use.dotted + "."))
    )


def _unfenced(found: Found) -> str | None:
    """What FENCE lacks for ``found`` (None: it is fenced)."""
    where, rows = f"jaxjob/{found.file}:{found.line}", [u for u in FENCE if _covers(u, found)]
    exact = [u for u in rows if u.dotted == found.dotted]
    if not rows:
        return f"{where} uses {found.dotted} ({found.kind}), which FENCE does not list: add a row"
    kinds = {
        OVERRIDE: {OVERRIDE},
        REPLACED: {REPLACED},
        BASE: {BASE},
        ATTRIBUTE: {ATTRIBUTE, METHOD, FIELD},
    }
    if found.kind in kinds and not any(u.kind in kinds[found.kind] for u in exact):
        return f"{where}: jaxjob's {found.kind} {found.dotted} needs a FENCE row of that kind"
    if found.kind == OVERRIDE and found.params != exact[0].params:
        return f"{where} overrides {found.dotted} with {found.params}; FENCE says {exact[0].params}"
    if found.kind == CALL and exact and not set(found.params) <= set(exact[0].params):
        return f"{where} passes {found.params} to {found.dotted}; FENCE lists {exact[0].params}"
    if not any(found.file in u.users for u in rows):
        return f"{where} uses {found.dotted}, but its FENCE row does not name jaxjob/{found.file}"
    return None


def test_every_private_use_is_fenced():
    """Each private Orbax or JAX name in jaxjob's sources has a FENCE row naming its user."""
    problems = sorted({p for p in map(_unfenced, _all_uses()) if p})
    assert not problems, "\n".join(problems)


def _mentions(user: str, use: Use) -> bool:
    """Whether jaxjob's ``user`` names ``use`` at all (a method of an instance, a copied body)."""
    with open(os.path.join(package_files.JAXJOB, user), encoding="utf-8") as f:
        text = f.read()
    last = use.dotted.rpartition(".")[2]
    return bool(re.search(rf"(?<!\w){re.escape(str(use.value or last))}(?!\w)", text))


def test_fence_has_no_stale_rows():
    """Each FENCE row is unique, and each user it names exists and (if visible in code) uses it."""
    found = _all_uses()
    keys = [(u.where, u.kind) for u in FENCE]
    problems = [f"FENCE lists {w} ({k}) twice" for w, k in set(keys) if keys.count((w, k)) > 1]
    for use in FENCE:
        for user in use.users:
            if not os.path.exists(os.path.join(package_files.JAXJOB, user)):
                problems.append(f"FENCE's row {use.where} names jaxjob/{user}, which is gone")
            elif not any(f.file == user and _covers(use, f) for f in found) and not _mentions(
                user, use
            ):
                problems.append(
                    f"FENCE's row {use.where} names jaxjob/{user}, which no longer uses it"
                )
    assert not problems, "\n".join(problems)


# ---- the checks themselves notice a change -------------------------------------------------

_MOVED = [
    (Use(f"{RENAME}._finalize", OVERRIDE, "x", (OC,)), "no longer exists"),
    (Use(f"{RENAME}.finalize", OVERRIDE, "x", (OC,), params=("now",)), "now takes ()"),
    (Use(f"{TSU}:build_array_write_spec", FUNCTION, "x", (OC,), params=("dtype", "info")),
     "jaxjob passes (dtype, info)"),
    (Use(f"{CLIENT}.wait_at_barrier", METHOD, "x", (HOSTS,), params=("barrier_id", "timeout_s")),
     "jaxjob passes (barrier_id, timeout_s)"),
    (Use(f"{SER}:_read_shard", REPLACED, "x", (RB,), params=("t", "new_shard_shape", "dtype",
     "requested_domain", "restricted_domain"), sha=(("0" * 16, "x"),)), "review jaxjob's copy"),
    (Use(f"{TYPES}:TMP_DIR_SUFFIX", NAME, "x", (OC,), value=".tmp"), "not '.tmp'"),
    (Use(f"{RENAME}._tmp_dir", ATTRIBUTE, "x", (OC,)), "no longer set on its instances"),
    (Use(f"{STEP}:StepMetadata.commit_time", FIELD, "x", (OC,)), "no longer a field"),
    (Use(f"{NUMPY}", CLASS, "x", (OC,)), ""),  # holds: the control
    (Use("orbax.checkpoint._src.sharding_utils:make_single_device_sharding", REPLACED, "x",
         (OC,)), "imported by name"),  # and called: in 4 Orbax modules (0.12.8)
]  # fmt: skip


@pytest.mark.parametrize(("use", "expected"), _MOVED, ids=lambda x: getattr(x, "where", ""))
def test_fence_notices_a_change(use, expected):
    """A row that no longer holds (as after an upgrade) is reported, saying what changed."""
    problems = "; ".join(_problems(use))
    assert (expected in problems) if expected else not problems, problems


_SUFFIX = f"{TYPES}:TMP_DIR_SUFFIX"
_BY_RELEASE = [
    (Use(_SUFFIX, NAME, "x", (OC,), value=".orbax-checkpoint-tmp", before=(("0.1", "x:y"),)), ""),
    (Use(_SUFFIX, NAME, "x", (OC,), before=(("999", f"{TYPES}:GONE"),)),
     "no longer exists (AttributeError: module 'orbax.checkpoint._src.path.atomicity_types' has no "
     f"attribute 'GONE') (in orbax-checkpoint {metadata.version('orbax-checkpoint')} (before 999), "
     f"at {TYPES}:GONE)"),
    (Use(_SUFFIX, NAME, "x", (OC,), before=(("999", None),)),
     f"is defined in orbax-checkpoint {metadata.version('orbax-checkpoint')} (before 999), where "
     "FENCE says it is not"),
    (Use(f"{TYPES}:GONE", NAME, "x", (OC,), before=(("999", None),)), ""),
]  # fmt: skip


@pytest.mark.parametrize(("use", "expected"), _BY_RELEASE)
def test_fence_rows_follow_the_installed_release(use, expected):
    """A row is checked as the installed release has it: newer, renamed before, or not there."""
    assert "; ".join(_release_problems(use)) == expected


def test_unfenced_uses_are_named():
    """A private use without its row, or a row not naming its user, fails naming file and line."""
    source = textwrap.dedent(
        """
        from orbax.checkpoint._src.path import atomicity, step
        class Later(atomicity.AtomicRenameTemporaryPath):
            async def finalize(self, extra):
                return self._snapshot, atomicity.COMMIT_SUCCESS_FILE
        """
    )
    problems = {_unfenced(f) for f in uses_in(source, OC, FILE_NAMES)} - {None}
    assert problems == {
        f"jaxjob/{OC}:2 uses orbax.checkpoint._src.path.step (reference), which FENCE does not "
        "list: add a row",
        f"jaxjob/{OC}:4 overrides {RENAME.replace(':', '.')}.finalize with ('extra',); "
        "FENCE says ()",
        f"jaxjob/{OC}:5 uses {RENAME.replace(':', '.')}._snapshot (instance attribute), which "
        "FENCE does not list: add a row",
    }
    elsewhere = {_unfenced(f) for f in uses_in(source, "_src/later.py", FILE_NAMES)} - {None}
    expected = f"jaxjob/_src/later.py:5 uses {ATOM}.COMMIT_SUCCESS_FILE, but its FENCE row"
    assert f"{expected} does not name jaxjob/_src/later.py" in elsewhere, elsewhere


# ---- each module of the fence says what it relies on ---------------------------------------

ORBAX_MODULES = sorted({u for use in FENCE for u in use.users if "/internals/orbax_" in u})


def _docstring_names(use: Use, doc: str) -> bool:
    """Whether ``doc`` names ``use``: its last name, or the value (a file name) it stands for."""
    last = use.dotted.rpartition(".")[2]
    return bool(re.search(rf"(?<!\w){re.escape(last)}(?!\w)", doc)) or (
        use.value is not None and str(use.value) in doc
    )


@pytest.mark.parametrize("module", ORBAX_MODULES)
def test_each_orbax_module_names_its_private_uses_in_its_docstring(module):
    """Each ``internals/orbax_*`` module's docstring names every private name its rows list."""
    with open(os.path.join(package_files.JAXJOB, module), encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    missing = [
        use.dotted for use in FENCE if module in use.users and not _docstring_names(use, doc)
    ]
    assert not missing, f"jaxjob/{module}'s docstring does not name {missing} (its FENCE rows)"


def test_the_release_check_says_what_the_installed_orbax_has():
    """``orbax_version.has_atomicity_options`` (which chooses how object-store items commit)
    agrees with the installed Orbax: 0.12.1-0.12.2 have no ``AtomicityOptions``, 0.12.3+ do."""
    import orbax.checkpoint as ocp

    from jaxjob._src.internals import orbax_version

    assert orbax_version.has_atomicity_options() == hasattr(ocp.options, "AtomicityOptions")
