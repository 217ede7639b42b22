"""What a child process of a test starts with: Ctrl-C as from a terminal, death with the test."""

import ctypes
import signal


def interruptible_child() -> None:
    """``preexec_fn`` of a child that a test interrupts with SIGINT; it dies with the test process.

    The child starts with SIGINT at its default and unblocked, whatever the test worker
    inherited or its threads left (a disposition or mask is inherited across exec: a CI
    run started in the background of a non-interactive shell ignores SIGINT, and so would
    the child); SIGKILL comes when the test process dies (PR_SET_PDEATHSIG).
    """
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
