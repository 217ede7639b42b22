"""Preemption signals: noticed while ``JobRunner.train`` runs, acted upon at an epoch boundary.

A scheduler preempts a job by sending it a signal (SIGTERM on Kubernetes,
SLURM and Cloud TPU) and killing it some seconds later. :class:`SignalWatch`
replaces the handlers of the given signals, for as long as it is entered,
with one that only records the signal; the runner reads :attr:`requested`
at each epoch boundary, saves that epoch and raises :class:`jaxjob.Preempted`.
On exit the previous handlers come back, including a handler installed
outside Python: ``jax.distributed.initialize`` installs one for SIGTERM in
C++ (JAX's preemption notifier), which ``signal.getsignal`` cannot see.

SIGINT (Ctrl-C), unless it is one of those signals, interrupts as usual,
except inside Orbax's calls that start a save or wait for one
(:class:`DeferredInterrupt`: interrupted there, Orbax loses the save) and
inside a session's call of a jitted program and swap to its results; the
runner then completes the save in flight under :class:`HeldSignal` (further
Ctrl-Cs are logged and ignored) before the KeyboardInterrupt propagates.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import signal
import threading
from collections.abc import Iterable
from typing import Any

from jaxjob._src.base.log import get_logger

__all__ = ["DeferredInterrupt", "HeldSignal", "SignalWatch", "check_signals"]

logger = get_logger(__name__)
_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}
_SIGACTION_SIZE = 512  # larger than any libc's struct sigaction: saved and restored as bytes


def check_signals(signals: Iterable[Any]) -> tuple[signal.Signals, ...]:
    """Returns ``signals`` as a tuple of ``signal.Signals``.

    Raises:
        ValueError: Naming ``preemption_signals``, the value and what is
            expected, for a non-signal or a signal that cannot be caught.

    Example:
        >>> check_signals([15])
        (<Signals.SIGTERM: 15>,)
    """
    if isinstance(signals, str | bytes) or not isinstance(signals, Iterable):
        raise ValueError(
            f"preemption_signals must be a sequence of signals, e.g. (signal.SIGTERM,); "
            f"got {signals!r}"
        )
    checked = []
    for value in signals:
        try:
            sig = signal.Signals(value)
        except (ValueError, TypeError):
            sig = None
        if sig is None or isinstance(value, bool) or sig in _UNCATCHABLE:
            raise ValueError(
                f"preemption_signals must hold signals that can be caught (e.g. "
                f"signal.SIGTERM, signal.SIGUSR1), got {value!r} in {signals!r}"
            )
        checked.append(sig)
    return tuple(dict.fromkeys(checked))


@functools.cache
def _libc() -> Any:
    """The C library (for ``sigaction``), found once: ``find_library`` runs ``ldconfig -p``."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        return libc if hasattr(libc, "sigaction") else None
    except OSError:
        return None


def _raw_handler(libc: Any, sig: signal.Signals) -> Any:
    """The process's ``struct sigaction`` for ``sig``, as opaque bytes (None if unavailable)."""
    if libc is None:
        return None
    saved = ctypes.create_string_buffer(_SIGACTION_SIZE)
    return saved if libc.sigaction(int(sig), None, saved) == 0 else None


class SignalWatch:
    """Records the given signals while entered; restores the previous handlers on exit.

    Entered off the main thread (where Python cannot install handlers), it
    does nothing and logs that at debug level. A signal that arrives again
    after the first is logged as a warning and otherwise ignored: the
    runner is saving and committing the preempted epoch, which a second
    signal must not tear (SIGKILL still kills; the committed epochs stay).

    Args:
        signals: The signals to watch; empty watches nothing.

    Example:
        >>> import signal
        >>> with SignalWatch([signal.SIGUSR1]) as watch:
        ...     signal.raise_signal(signal.SIGUSR1)  # handled before it returns
        >>> watch.requested, signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
        (True, True)
    """

    def __init__(self, signals: Iterable[signal.Signals]) -> None:
        self.signals = tuple(signals)
        self.received: list[signal.Signals] = []
        self._previous: dict[signal.Signals, tuple[Any, Any]] = {}

    @property
    def requested(self) -> bool:
        """Whether one of the signals arrived while entered."""
        return bool(self.received)

    def _handle(self, signum: int, frame: Any) -> None:
        sig = signal.Signals(signum)
        self.received.append(sig)
        if len(self.received) == 1:
            logger.warning("Received %s: stopping after this epoch, once it is saved", sig.name)
        else:
            logger.warning(
                "Received %s again: ignored while the preempted epoch is saved and committed",
                sig.name,
            )

    def __enter__(self) -> SignalWatch:
        if not self.signals:
            return self
        if threading.current_thread() is not threading.main_thread():
            logger.debug("Not watching preemption signals: train runs off the main thread")
            return self
        libc = _libc()
        for sig in self.signals:
            self._previous[sig] = (_raw_handler(libc, sig), signal.getsignal(sig))
            signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        libc = _libc() if self._previous else None
        for sig, (raw, handler) in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            if raw is not None and libc is not None:
                libc.sigaction(int(sig), raw, None)  # a handler installed outside Python, too
        self._previous.clear()


class HeldSignal:
    """Logs and ignores ``sig`` while entered, on the main thread, so that ``what`` completes.

    The previous handler comes back on exit. Off the main thread it does nothing.

    Args:
        sig: The signal to hold, e.g. ``signal.SIGINT``.
        what: What must not be torn, for the log line, e.g. ``"the save in flight"``.

    Example:
        >>> import signal
        >>> with HeldSignal(signal.SIGUSR2, "an example"):
        ...     signal.raise_signal(signal.SIGUSR2)  # logged, ignored
        >>> signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
        True
    """

    def __init__(self, sig: signal.Signals, what: str) -> None:
        self.sig = sig
        self.what = what
        self._previous: Any = None
        self._held = False

    def _handle(self, signum: int, frame: Any) -> None:
        logger.warning(
            "Received %s: ignored until %s is complete (SIGKILL stops at once; committed "
            "epochs stay)",
            signal.Signals(signum).name,
            self.what,
        )

    def __enter__(self) -> HeldSignal:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(self.sig, self._handle)
            self._held = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._held:
            signal.signal(
                self.sig, self._previous if self._previous is not None else signal.SIG_DFL
            )
            self._held = False


class DeferredInterrupt:
    """Holds back Ctrl-C's KeyboardInterrupt while entered; :meth:`raise_if_received` raises it.

    Interrupted inside ``Thread.join`` (CPython 3.11 marks the thread stopped
    while it runs) or inside Orbax's start of a save, Orbax loses the save
    and its background thread fails at the interpreter's exit; interrupted
    between a jitted program's call, which donates the workspace's buffers,
    and the session's swap to its results, the session would hold deleted
    arrays (:meth:`jaxjob.Session.run`). Only
    Python's own SIGINT handler is replaced, and only on the main thread;
    another handler (a preemption watch, :class:`HeldSignal`, the user's) is
    left alone.

    Example:
        >>> import signal
        >>> previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own
        >>> deferred = DeferredInterrupt()
        >>> with deferred:
        ...     signal.raise_signal(signal.SIGINT)  # recorded, not raised here
        >>> deferred.received
        True
        >>> try:
        ...     deferred.raise_if_received()
        ... except KeyboardInterrupt:
        ...     print("raised after the block")
        raised after the block
        >>> _ = signal.signal(signal.SIGINT, previous)
    """

    def __init__(self) -> None:
        self.received = False
        self._previous: Any = None

    def _record(self, signum: int, frame: Any) -> None:
        self.received = True

    def __enter__(self) -> DeferredInterrupt:
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            self._previous = signal.signal(signal.SIGINT, self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def raise_if_received(self) -> None:
        """Raises the KeyboardInterrupt held back, if SIGINT arrived while entered.

        Raises:
            KeyboardInterrupt: If it did.
        """
        if self.received:
            self.received = False
            raise KeyboardInterrupt
