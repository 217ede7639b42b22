"""Per-epoch progress of a run: a live bar or one plain line per epoch, and the history.

``JobRunner(..., progress=["loss", "accuracy"])`` shows, after every epoch,
the epoch, those values (epoch outputs or persistent leaves, scalars), the
epoch's wall time and the part of it the training thread spent saving. Where
stdout is a terminal, or in Jupyter with ``ipywidgets`` installed, that is a
``tqdm.auto`` bar (a widget in a notebook); otherwise one plain line per
epoch on stdout, e.g.::

    epoch 3  loss 0.2147  accuracy 0.9444  time 0.412s  save 0.012s

A save that failed shows ``save FAILED`` instead of its time; the failure
of an earlier epoch's background write, found during this epoch's save,
shows as ``save of epoch 2 FAILED`` after the time (the record's
``"save_failed"`` lists those epochs).

Only process 0 of a multi-process job displays; every process keeps the
history. This module and the CLI are the only parts of jaxjob that print.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

__all__ = ["Progress", "check_names", "format_line"]

RESERVED = ("epoch", "epoch_time_s", "save_time_s", "save_interval_s", "saved_to")  # history keys
SAVE_FAILED = "save_failed"  # the key, only in a record whose save met failures: their epochs


def check_names(progress: Any) -> tuple[str, ...] | None:
    """Validates ``JobRunner``'s ``progress`` argument.

    Raises:
        TypeError: If it is not None or a sequence of names (a bare string is refused).
        ValueError: If a name is one of the history's own keys, or repeated.
    """
    if progress is None:
        return None
    if isinstance(progress, str) or not isinstance(progress, Sequence):
        raise TypeError(
            "progress must be None or a list of names of scalar epoch outputs or leaves, "
            f'e.g. ["loss"], got {progress!r}'
        )
    bad = [name for name in progress if not isinstance(name, str) or not name]
    if bad:
        raise TypeError(f"progress: names must be non-empty strings, got {bad!r}")
    clash = sorted({n for n in progress if n in RESERVED or list(progress).count(n) > 1})
    if clash:
        raise ValueError(
            f"progress: names {clash} are repeated or clash with the history's own keys "
            f"{list(RESERVED)}; rename those outputs"
        )
    return tuple(progress)


def _scalar(name: str, ws: Mapping[str, Any], epoch: int) -> float:
    if name not in ws:
        raise KeyError(
            f"progress name {name!r} is neither an output nor a leaf of epoch {epoch}; "
            f"the epoch has {sorted(ws)}"
        )
    value = ws[name]
    if not jax.tree_util.all_leaves([value]) or np.size(value) != 1:
        raise ValueError(
            f"progress name {name!r} must be a scalar, got {type(value).__name__} of shape "
            f"{np.shape(value)} at epoch {epoch}"
        )
    return float(np.asarray(value).reshape(()))


def format_line(record: Mapping[str, Any]) -> str:
    """One plain progress line for a history record.

    Example:
        >>> format_line({"epoch": 3, "loss": 0.25, "epoch_time_s": 0.5, "save_time_s": 0.01})
        'epoch 3  loss 0.2500  time 0.500s  save 0.010s'
        >>> format_line({"epoch": 4, "epoch_time_s": 0.5, "save_time_s": 0.01, "save_failed": [4]})
        'epoch 4  time 0.500s  save FAILED'
        >>> format_line({"epoch": 5, "epoch_time_s": 0.5, "save_time_s": 0.01, "saved_to": "local"})
        'epoch 5  time 0.500s  save 0.010s local'
    """
    values = [
        f"{k} {v:.4g}" if abs(v) >= 1e4 or (v and abs(v) < 1e-3) else f"{k} {v:.4f}"
        for k, v in record.items()
        if k not in (*RESERVED, SAVE_FAILED)
    ]
    failed = record.get(SAVE_FAILED, [])
    own = "save FAILED" if record["epoch"] in failed else f"save {record['save_time_s']:.3f}s"
    if record.get("saved_to") and record["epoch"] not in failed:
        own += f" {record['saved_to']}"
    earlier = [f"save of epoch {e} FAILED" for e in failed if e != record["epoch"]]
    return "  ".join(
        [f"epoch {record['epoch']}", *values, f"time {record['epoch_time_s']:.3f}s", own, *earlier]
    )


def _live_bar() -> bool:
    """A terminal, or a Jupyter kernel that can show tqdm's widget (else tqdm would warn)."""
    if sys.stdout.isatty():
        return True
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    if shell is None or "IPKernelApp" not in getattr(shell, "config", {}):
        return False
    return importlib.util.find_spec("ipywidgets") is not None


class Progress:
    """Records each epoch in ``history`` and displays it (bar or plain line).

    Args:
        names: The scalar names to show and record, or None (record the
            epoch and its times only; show nothing).
        history: The list the records are appended to.
        total: The epoch limit, if known (the bar's length).
        display: Whether this process shows progress (process 0 does).

    Example:
        >>> import io, contextlib
        >>> history = []
        >>> progress = Progress(["loss"], history, display=True)
        >>> with contextlib.redirect_stdout(io.StringIO()) as out:
        ...     values = progress.values(1, {"loss": 0.5, "x": 3})
        ...     _ = progress.epoch_done(1, values, epoch_time_s=0.25, save_time_s=0.0)
        ...     progress.close()
        >>> history
        [{'epoch': 1, 'loss': 0.5, 'epoch_time_s': 0.25, 'save_time_s': 0.0}]
        >>> out.getvalue().splitlines()
        ['epoch 1  loss 0.5000  time 0.250s  save 0.000s']
    """

    def __init__(
        self,
        names: Sequence[str] | None,
        history: list[dict[str, Any]],
        *,
        total: int | None = None,
        display: bool = True,
    ) -> None:
        self.names = tuple(names or ())
        self.history = history
        self.total = total
        self.display = display and names is not None
        self._bar: Any = None
        self._failed: list[int] = []

    def save_failed(self, epoch: int) -> None:
        """Notes that the save of ``epoch`` failed: the next record shows it."""
        self._failed.append(epoch)

    def values(self, epoch: int, ws: Mapping[str, Any]) -> dict[str, float]:
        """The names' values in epoch ``epoch``'s run workspace ``ws`` (a device sync if any).

        Raises:
            KeyError: If a name is not in ``ws``.
            ValueError: If a name's value is not a scalar.
        """
        return {name: _scalar(name, ws, epoch) for name in self.names}

    def epoch_done(
        self,
        epoch: int,
        values: Mapping[str, float],
        *,
        epoch_time_s: float,
        save_time_s: float,
        saved_to: str | None = None,
    ) -> dict[str, Any]:
        """Records epoch ``epoch`` with ``values`` (from :meth:`values`); shows and returns it."""
        record: dict[str, Any] = {"epoch": epoch, **values}
        record.update(epoch_time_s=epoch_time_s, save_time_s=save_time_s)
        if saved_to is not None:  # a manager with two tiers: which one this epoch went to
            record["saved_to"] = saved_to
        if self._failed:
            record[SAVE_FAILED], self._failed = self._failed, []
        self.history.append(record)
        if self.display:
            self._show(record)
        return record

    def _show(self, record: dict[str, Any]) -> None:
        if self._bar is None and not _live_bar():
            # one write with its newline: a Ctrl-C between print's two writes left the line
            # open, and the next output (a log line, the caller's) joined it
            sys.stdout.write(format_line(record) + "\n")
            sys.stdout.flush()
            return
        if self._bar is None:
            from tqdm.auto import tqdm

            start = record["epoch"] - 1
            self._bar = tqdm(total=self.total, initial=start, unit="epoch", file=sys.stdout)
        self._bar.set_description(f"epoch {record['epoch']}", refresh=False)
        self._bar.set_postfix_str(format_line(record).split("  ", 1)[1], refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        """Closes the bar, if one is shown."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
