"""SIGTERM and Ctrl-C as `Interrupted`, raised where Python runs and kept until training sees it.

The command line handles both signals with `on_signal`, which raises
`Interrupted` in the main thread as soon as it runs Python. If that Python
is a callback of code that clears a pending error (a C extension's, an
object's `__del__`), the raise is lost and a run would go on as if never
stopped; the signal stays recorded here, and the training loops raise it at
their next step (`raise_pending`, `kbert.fitting.backup.PendingInterrupt`).
"""

import signal


class Interrupted(KeyboardInterrupt):
    """A signal, raised like Ctrl-C so that half-written outputs are removed on the way out."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


_pending = None


def on_signal(signum, frame):
    """A signal handler: records `signum`, then raises `Interrupted`."""
    global _pending
    _pending = signum
    raise Interrupted(signum)


def raise_pending():
    """Raises `Interrupted` for a signal whose handler's raise was lost; else nothing."""
    if _pending is not None:
        raise Interrupted(_pending)


def handle_signals():
    """Installs `on_signal` for SIGTERM, and for SIGINT unless it is ignored (a
    process started in the background); returns what to give `restore`."""
    global _pending
    _pending = None
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, on_signal)}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, on_signal)
    return previous


def restore(previous):
    """Puts back the handlers `handle_signals` replaced, and forgets any pending signal."""
    global _pending
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    _pending = None
