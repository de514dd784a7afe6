"""Where kbert's progress lines and warnings go when the caller names no `log`.

Functions that report as they work take `log`, a callable of one str, so a
caller can collect the lines (a benchmark, a test) or silence them. Without
one, the lines go to standard error, flushed at once so that a user watching
a run of minutes sees each as it comes; results go to standard output
(`kbert.cliio.print_json`).

Work of a known size (rows to run, steps to train) reports through
`Progress`: a tqdm bar with its rate and the time left where the lines go to
a terminal, else a line every `LINE_SECONDS`, which a log file or a CI job
reads one line at a time (a bar's carriage returns would pile up there).
Work not counted as it goes (a task's `encode`) reports through `Waiting`:
a line every `LINE_SECONDS` while it lasts.
"""

import sys
import threading
import time

# Seconds between two progress lines where standard error is not a terminal:
# often enough to tell a slow step from a hang, seldom enough to read the log.
LINE_SECONDS = 20
# A bar on a terminal shows only once its work has run this long, so that
# quick steps do not flash one.
BAR_DELAY_SECONDS = 2


def to_stderr(line):
    """Prints `line` to standard error, flushed."""
    print(line, file=sys.stderr, flush=True)


def warn(message):
    """Prints `kbert: warning: {message}` to standard error, flushed."""
    to_stderr(f"kbert: warning: {message}")


def quiet(line):
    """A `log` that drops every line."""


def duration(seconds):
    """`seconds` as a person says it: "45 s", "4 min 10 s", "1 h 05 min"."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def on_terminal(log):
    """Whether `log`'s lines go to a terminal: it is `to_stderr` and standard error is one."""
    return log is to_stderr and sys.stderr.isatty()


class Progress:
    """Work done toward a known `total`, reported as it goes.

    Where `log` is `to_stderr` and standard error a terminal, a tqdm bar
    (shown after `BAR_DELAY_SECONDS`, removed when done); otherwise a line
    through `log` at most every `LINE_SECONDS`, and a last one when done if
    any was written: `predict: 3,072/87,599 examples in 20 s, 153.6
    examples/s, about 9 min 10 s left`.

    Args:
        desc: str. What is done ("encoding", "dev").
        total: int, or None where unknown (a stream): no time left is shown.
        unit: str. What a unit is, plural ("examples", "steps").
        log: callable taking a str, or None (standard error).
        initial: int. Units already done (a resumed run).

    Example:
    >>> with Progress("counting", 3, "numbers", log=print) as progress:
    ...     for _ in range(3):
    ...         progress.update()
    """

    def __init__(self, desc, total, unit, log=None, initial=0):
        self.desc, self.total, self.unit = desc, total, unit
        self.log = log or to_stderr
        self.n = self.initial = initial
        self.start = self.last_line = time.monotonic()
        self.lines = 0
        self.bar = None
        if on_terminal(self.log):
            from tqdm import tqdm

            self.bar = tqdm(
                desc=desc, total=total, unit=" " + unit, initial=initial, file=sys.stderr,
                delay=BAR_DELAY_SECONDS, leave=False, dynamic_ncols=True,
            )

    def update(self, n=1, postfix=""):
        """Counts `n` more units done; `postfix` (str) is shown after the rate."""
        self.n += n
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(n)
            return
        now = time.monotonic()
        if now - self.last_line >= LINE_SECONDS:
            self.last_line = now
            self.lines += 1
            self.log(self.line(postfix))

    def line(self, postfix=""):
        """The progress so far, in one line: done, rate, time left."""
        elapsed = time.monotonic() - self.start
        done = self.n - self.initial
        rate = done / elapsed if elapsed > 0 else 0.0
        speed = f"{rate:,.1f} {self.unit}/s" if rate >= 1 else f"{1 / rate:,.2f} s each" if rate else "?"
        known = self.total is not None  # None: a stream's, known at its end
        left = f", about {duration((self.total - self.n) / rate)} left" if known and rate and self.n < self.total else ""
        after = f", {postfix}" if postfix else ""
        count = f"{self.n:,}/{self.total:,}" if known else f"{self.n:,}"
        return f"{self.desc}: {count} {self.unit} in {duration(elapsed)}, {speed}{left}{after}"

    def close(self, done=True):
        """Ends the report: the bar removed, or a last line if any was written
        and the work is `done` (not stopped by an error)."""
        if self.bar is not None:
            self.bar.close()
        elif self.lines and done:
            self.log(self.line())

    def __enter__(self):
        return self

    def __exit__(self, error_type, error, traceback):
        self.close(done=error_type is None)


class Waiting:
    """Work that is not counted as it goes: a line through `log` every
    `LINE_SECONDS` while it lasts (`encoding 87,599 training examples: 40 s so
    far`), and one with its time when it ends, if any was written.

    Args:
        desc: str. What is done.
        log: callable taking a str, or None (standard error); called from a
            thread of its own while the work runs.

    Example:
    >>> with Waiting("sleeping", log=print):
    ...     time.sleep(0.01)
    """

    def __init__(self, desc, log=None):
        self.desc, self.log = desc, log or to_stderr
        self.lines = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="kbert-waiting", daemon=True)

    def _beat(self):
        while not self._done.wait(LINE_SECONDS):
            self.lines += 1
            self.log(f"{self.desc}: {duration(time.monotonic() - self.start)} so far")

    def __enter__(self):
        self.start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, error_type, error, traceback):
        self._done.set()
        self._thread.join()
        if self.lines and error_type is None:
            self.log(f"{self.desc}: done in {duration(time.monotonic() - self.start)}")
