"""Where kbert's progress lines and warnings go when the caller names no `log`.

Functions that report as they work take `log`, a callable of one str, so a
caller can collect the lines (a benchmark, a test) or silence them. Without
one, the lines go to standard error, flushed at once so that a user watching
a run of minutes sees each as it comes; results go to standard output
(`kbert.cliio.print_json`).
"""

import sys


def to_stderr(line):
    """Prints `line` to standard error, flushed."""
    print(line, file=sys.stderr, flush=True)


def warn(message):
    """Prints `kbert: warning: {message}` to standard error, flushed."""
    to_stderr(f"kbert: warning: {message}")
