"""What the ``jaxjob`` subcommands print: ``ls``, ``show``, ``export``, ``verify`` and ``bench``.

Each command is a function returning the exit status; :mod:`jaxjob.cli`
parses the arguments and turns a user mistake into one line on stderr. The
heavy imports (JAX, Orbax) happen here, when a command runs, never for ``--help``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["bench", "export", "ls", "show", "verify"]


# ---- formatting ---------------------------------------------------------------------------------


def human(size: float) -> str:
    """A byte count for people.

    Example:
        >>> human(512), human(1536), human(3 * 1024**3)
        ('512 B', '1.5 KiB', '3.0 GiB')
    """
    if size < 1024:
        return f"{size:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024:
            return f"{size:.1f} {unit}"
    return f"{size / 1024:.1f} TiB"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _age(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, width in (("d", 86400), ("h", 3600), ("min", 60)):
        if value >= width:
            return f"{value / width:.1f} {unit}"
    return f"{value:.0f} s"


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


# ---- ls -----------------------------------------------------------------------------------------


def ls(directory: str, *, as_json: bool = False) -> int:
    """Prints a row per checkpoint under ``directory``: node, epoch, committed, size, save, age.

    A db_prefix whose run has a local tier also lists that tier's
    directories on this machine, with a ``tier`` column.
    """
    from jaxjob._src.checkpoint.listing import list_tiers

    rows = [row.to_json() for row in list_tiers(directory)]
    if as_json:
        print(json.dumps(rows, indent=1))
        return 0
    tiers = any(r["tier"] != "persistent" for r in rows)
    table = [("node", "epoch", "committed", "size", "save", "age", *(("tier",) if tiers else ()))]
    for r in rows:
        committed = "yes" if r["committed"] else "no"
        size, save, age = human(r["size_bytes"]), _seconds(r["save_s"]), _age(r["age_s"])
        tier = (r["tier"],) if tiers else ()
        table.append((r["node"], str(r["epoch"]), committed, size, save, age, *tier))
    _print_table(table)
    return 0


# ---- show ---------------------------------------------------------------------------------------


def _leaf_nbytes(spec: Any) -> int:
    """Logical bytes of a stored leaf (PRNG keys: their key data)."""
    import jax
    import numpy as np

    from jaxjob._src.base.leaves import Kind

    abstract = spec.abstract()
    if spec.kind == Kind.PRNG_KEY:
        abstract = jax.eval_shape(jax.random.key_data, abstract)
    return int(np.prod(abstract.shape, dtype=np.int64)) * abstract.dtype.itemsize


def _selected_leaves(found: Any, patterns: Sequence[str] | None, where: str) -> list[tuple]:
    """``(key path, stored name)`` of the leaves ``patterns`` select (default: all)."""
    from jaxjob._src.checkpoint import keypaths

    chosen = keypaths.select(found.state, patterns or None, where=where)
    return [
        (keypaths.join(segs), stored)
        for sel in chosen.values()
        for segs, stored in keypaths.leaf_names(sel.structure, (sel.name, *sel.segments))
    ]


def _saved_sharding(spec: Any, found: Any, shardings: dict[str, str]) -> str:
    if found.owner_process is not None:
        return f"host (process {found.owner_process})"
    if spec.host_local:
        return "host-local (per process)"
    return shardings.get(spec.name, "-")


def show(
    path: str,
    *,
    patterns: Sequence[str] | None = None,
    epoch: int | None = None,
    node: str | None = None,
) -> int:
    """Prints the leaves of a checkpoint: key path, shape, dtype, bytes, saved sharding; totals."""
    from jaxjob._src.base import fs
    from jaxjob._src.checkpoint import manifest
    from jaxjob._src.checkpoint.restore import checkpoint_dirs
    from jaxjob._src.internals import orbax_files

    for directory in checkpoint_dirs(path, epoch, node):
        found = manifest.read(directory)
        leaves = _selected_leaves(found, patterns, f" in the checkpoint at {directory!r}")
        shardings = orbax_files.saved_shardings(directory)
        print(
            f"{directory}: node {found.node}, epoch {found.epoch}, "
            f"saved by {found.process_count} process(es)"
        )
        table = [("key path", "shape", "dtype", "bytes", "saved sharding")]
        total = 0
        for key, stored in leaves:
            spec = found.leaves[stored]
            nbytes = _leaf_nbytes(spec)
            total += nbytes
            shape = (
                "(" + ", ".join(map(str, spec.shape)) + ("," if len(spec.shape) == 1 else "") + ")"
            )
            sharding = _saved_sharding(spec, found, shardings)
            table.append((key, shape, spec.dtype, human(nbytes), sharding))
        _print_table(table)
        print(
            f"total: {len(leaves)} leaves, {human(total)} "
            f"({human(fs.size(directory))} on disk, whole checkpoint)"
        )
    return 0


# ---- export -------------------------------------------------------------------------------------


EXPORT_INFO = "__jaxjob__"  # the .npz entry (safetensors: metadata key "jaxjob") saying how to read
# the others back: {"prng_impl": {key path: implementation}, "dtype": {key path: dtype name}}
NPZ, SAFETENSORS = ".npz", ".safetensors"


def _bits(value: Any) -> Any:
    """An array of a dtype outside NumPy's (bfloat16, float8, int4) as its bits: uint8/16/..."""
    import numpy as np

    return value.view(np.dtype(f"uint{8 * value.dtype.itemsize}"))


def _is_extension(dtype: Any) -> bool:
    """Whether ``dtype`` is one of ml_dtypes' (bfloat16, float8, int4, ...)."""
    return dtype.kind == "V" or type(dtype).__module__.startswith("ml_dtypes")


def _exported_key(key: str, strip_value: bool) -> str:
    return key.removesuffix("/value") if strip_value else key


def _flat_arrays(workspace: Any, strip_value: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """Every leaf of the restored workspace as a NumPy array by its ``/``-joined key path.

    Returns:
        The arrays (PRNG keys as their key data), and each PRNG key's implementation.

    Raises:
        ValueError: If two leaves get one key (``strip_value``: ``w`` and ``w/value``).
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxjob._src.checkpoint import keypaths

    arrays: dict[str, Any] = {}
    impls: dict[str, str] = {}
    for name in workspace:
        for path, leaf in jax.tree_util.tree_flatten_with_path(workspace[name])[0]:
            full = keypaths.join((name, *keypaths.entry_segments(path)))
            key = _exported_key(full, strip_value)
            if key in arrays or key == EXPORT_INFO:
                raise ValueError(
                    f"the leaf {full} would be exported as {key!r}, which another leaf or the "
                    f"export's {EXPORT_INFO} entry already is; export without --strip-nnx-value "
                    "or select fewer leaves"
                )
            if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                impls[key] = str(jax.random.key_impl(leaf))
                leaf = jax.random.key_data(leaf)
            arrays[key] = np.asarray(leaf)
    return arrays, impls


def _as_stored(arrays: dict[str, Any], native: tuple[str, ...]) -> dict[str, str]:
    """Replaces arrays of dtypes the format lacks (not in ``native``) by their bits, in place.

    Returns:
        Each replaced array's dtype name, by key.
    """
    dtypes = {}
    for key, value in arrays.items():
        if _is_extension(value.dtype) and value.dtype.name not in native:
            dtypes[key] = value.dtype.name
            arrays[key] = _bits(value)
    return dtypes


def _write_npz(arrays: dict[str, Any], info: dict[str, Any], output: str) -> None:
    import numpy as np

    entries = dict(arrays)
    if info:  # a 0-d str array: np.load reads it back without pickle
        entries[EXPORT_INFO] = np.array(json.dumps(info, sort_keys=True))
    with open(output, "wb") as f:
        np.savez(f, **entries)


def _write_safetensors(arrays: dict[str, Any], info: dict[str, Any], output: str) -> None:
    try:
        from safetensors.numpy import save_file
    except ImportError:
        raise ValueError(
            "writing .safetensors needs the safetensors package: pip install safetensors"
        ) from None
    metadata = {"jaxjob": json.dumps(info, sort_keys=True)} if info else None
    save_file({k: v.copy(order="C") for k, v in arrays.items()}, output, metadata=metadata)


def _say_how(impls: dict[str, str], dtypes: dict[str, str], where: str) -> None:
    if impls:
        keys = ", ".join(f"{k} ({v})" for k, v in impls.items())
        print(f"PRNG keys as their key data, implementation in {where}: {keys}")
    if dtypes:
        keys = ", ".join(f"{k} ({v})" for k, v in dtypes.items())
        print(f"stored as their bits (unsigned ints), dtype in {where}: {keys}")


def export(
    path: str,
    output: str,
    *,
    patterns: Sequence[str] | None = None,
    epoch: int | None = None,
    node: str | None = None,
    strip_value: bool = False,
) -> int:
    """Writes the selected leaves to ``output`` (``.npz``, ``.safetensors``) by key path.

    Nothing is lost: a PRNG key is written as its key data (uint32) and its
    implementation recorded; a dtype the format lacks (``.npz``: bfloat16,
    float8, int4; ``.safetensors``: all but bfloat16) as its bits, the dtype
    recorded. The record is a JSON object ``{"prng_impl": {key: impl},
    "dtype": {key: name}}``: the ``.npz`` entry ``__jaxjob__``, the
    ``.safetensors`` metadata key ``jaxjob``, written when there is
    something to record. With ``strip_value``, a key path's trailing
    ``/value`` (flax NNX Variables) is dropped.
    """
    suffix = os.path.splitext(output)[1]
    if suffix not in (NPZ, SAFETENSORS):
        raise ValueError(f"output must end in .npz or .safetensors, got {output!r}")
    import jaxjob

    workspace = jaxjob.restore(path, epoch=epoch, node_name=node, leaves=patterns or None)
    arrays, impls = _flat_arrays(workspace, strip_value)
    dtypes = _as_stored(arrays, ("bfloat16",) if suffix == SAFETENSORS else ())
    info = {k: v for k, v in (("prng_impl", impls), ("dtype", dtypes)) if v}
    if suffix == SAFETENSORS:
        _write_safetensors(arrays, info, output)
        _say_how(impls, dtypes, "the metadata key 'jaxjob'")
    else:
        _write_npz(arrays, info, output)
        _say_how(impls, dtypes, f"the entry {EXPORT_INFO!r}")
    total = sum(a.nbytes for a in arrays.values())
    print(f"wrote {len(arrays)} arrays, {human(total)}, to {output}")
    return 0


# ---- verify -------------------------------------------------------------------------------------


def verify(path: str) -> int:
    """Checks each checkpoint at ``path``: a line per problem and exit 1, or ``ok`` and 0.

    The verdict is :func:`jaxjob._src.checkpoint.verify.verify`'s, line for line.
    """
    from jaxjob._src.checkpoint.verify import verify_each

    damaged = 0
    for directory, problems in verify_each(path):
        for line in problems:
            print(line)
        if not problems:
            print(f"ok  {directory}")
        damaged += bool(problems)
    if damaged:
        print(f"{damaged} damaged checkpoint(s)")
    return 1 if damaged else 0


# ---- bench --------------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _print_bench(report: dict[str, Any]) -> None:
    print(
        f"{report['leaves']} leaves, {human(report['bytes'])}, in {report['directory']} "
        f"(medians of {report['repeats']})\n"
    )
    print("| figure | jaxjob | reference | ratio |\n|---|---|---|---|")
    for name, row in report["figures"].items():
        mine, other = _ms(row["jaxjob_s"]), _ms(row["reference_s"])
        if name == "step_with_save":
            mine += f" ({report['slowdown_pct']['jaxjob']:+.0f} %)"
            other += f" ({report['slowdown_pct']['reference']:+.0f} %)"
        print(f"| {row['what']} | {mine} | {other} | {row['ratio']:.2f}x |")
    print(f"\nstep alone: {_ms(report['step_s'])}; reference: {report['reference']}")


def bench(
    directory: str,
    *,
    leaves: int | None = None,
    size: str | None = None,
    like: str | None = None,
    repeats: int = 3,
    step_seconds: float = 0.2,
    as_json: bool = False,
) -> int:
    """Prints what saves, restores and saving every step cost in ``directory``, beside a reference.

    Args:
        directory: An existing directory this user can write in, or ``gs://`` / ``s3://``.
        leaves: The synthetic workspace's leaf count (default 56).
        size: Its total size, e.g. ``"64MiB"`` (the default).
        like: A checkpoint (or db_prefix) whose leaves' shapes and dtypes to take instead.
        repeats: How many times each figure is measured (medians are printed).
        step_seconds: The jitted step's least duration alone.
        as_json: Print the report as JSON.

    Raises:
        ValueError: If an option is out of range or malformed (naming it).
        FileNotFoundError: If ``directory`` (or ``like``) does not exist.
        PermissionError: If this user cannot write in ``directory``.
    """
    from jaxjob._src.cli.bench import check_directory, measure
    from jaxjob._src.cli.bench_shape import workspace_leaves

    if repeats < 1:
        raise ValueError(f"--repeats: got {repeats}; expected at least 1")
    if not step_seconds > 0:
        raise ValueError(f"--step-seconds: got {step_seconds}; expected a positive number")
    directory = check_directory(directory)
    shape = workspace_leaves(leaves, size, like)
    report = measure(directory, shape, repeats=repeats, step_seconds=step_seconds)
    if as_json:
        print(json.dumps(report, indent=1))
    else:
        _print_bench(report)
    return 0
