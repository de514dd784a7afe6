"""SIGTERM and Ctrl-C as `Interrupted`, raised where Python runs and kept until training sees it.

The command line handles both signals with `on_signal`, which raises
`Interrupted` in the main thread as soon as it runs Python. Python that runs
inside a garbage-collector callback (JAX's `_xla_gc_callback`, which importing
Keras registers where JAX is installed, runs at every collection), a weak
reference's callback or an object's `__del__` cannot raise: Python hands the
exception to `sys.unraisablehook`, which prints "Exception ignored in ..." with
a traceback, and goes on. While the handlers are installed, that hook takes an
`Interrupted` and has the signal handled again a moment later
(`REDELIVERY_DELAY_S`), from a helper thread, so that the raise lands once
that callback has returned. A raise lost elsewhere (a C extension's callback
that clears a pending error) would let a run go on as if never stopped; the
signal stays recorded here, and the training loops raise it at their next
step (`raise_pending`, `kbert.fitting.backup.PendingInterrupt`).
"""

import _thread
import os
import signal
import sys
import threading
import time

# How long a signal that landed inside a callback waits before it is handed to
# the main thread again: callbacks run for milliseconds (a collection), and a
# person who pressed Ctrl-C notices no 10 ms.
REDELIVERY_DELAY_S = 0.01


class Interrupted(KeyboardInterrupt):
    """A signal, raised like Ctrl-C so that half-written outputs are removed on the way out."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


_pending = None
_redelivery = None  # the helper thread while handlers are installed
_previous_unraisablehook = None


def on_signal(signum, frame):
    """A signal handler: records `signum`, then raises `Interrupted` (which
    `_redeliver_unraisable` hands back if a callback swallows it)."""
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
    global _pending, _redelivery, _previous_unraisablehook
    _pending = None
    _redelivery = _Redelivery()
    _previous_unraisablehook, sys.unraisablehook = sys.unraisablehook, _redeliver_unraisable
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, on_signal)}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, on_signal)
    return previous


def restore(previous):
    """Puts back the handlers `handle_signals` replaced, and forgets any pending signal."""
    global _pending, _redelivery, _previous_unraisablehook
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    if _previous_unraisablehook is not None:
        sys.unraisablehook, _previous_unraisablehook = _previous_unraisablehook, None
    _pending = None
    if _redelivery is not None:
        _redelivery.stop()
        _redelivery = None


def _redeliver_unraisable(unraisable):
    """`sys.unraisablehook` while the handlers are installed: an `Interrupted`
    raised where Python cannot raise is asked for again from the helper thread;
    anything else goes to the hook that was there before."""
    if isinstance(unraisable.exc_value, Interrupted) and _redelivery is not None:
        _redelivery.ask()
    else:
        _previous_unraisablehook(unraisable)


class _Redelivery:
    """A helper thread that hands the pending signal to the main thread again
    (`_thread.interrupt_main`, which calls its handler as a signal would).

    The handler asks through a pipe: a write takes no lock, so a second
    signal landing while the first one asks cannot deadlock it.
    """

    def __init__(self):
        self._read, self._write = os.pipe()
        self._thread = threading.Thread(target=self._run, name="kbert-signal-redelivery", daemon=True)
        self._thread.start()

    def ask(self):
        os.write(self._write, b"a")

    def stop(self):
        os.write(self._write, b"s")
        self._thread.join(timeout=1)
        os.close(self._write)

    def _run(self):
        try:
            while os.read(self._read, 1) == b"a":
                time.sleep(REDELIVERY_DELAY_S)
                signum = _pending
                if signum is not None and _redelivery is self:
                    _thread.interrupt_main(signum)
        finally:
            os.close(self._read)
