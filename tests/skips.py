"""The only reasons a test may skip, and the check that holds a run to them.

A skip is a test that proved nothing. Every library a test compares against is
declared in the `dev` extra, so a missing one is an error, not a skip; what a
machine may lack is hardware, and the few reasons below name it. Under
`KBERT_STRICT_SKIPS=1` (the Makefile's test targets, and so CI) a run in which
a test skips for any other reason fails, naming the test and its reason; a
developer running one file by hand is not held to it.

A test that skips for one of these reasons passes the message as made here:
`pytest.skip(skips.cpu_only("activations live in the accelerator's memory"))`,
`pytest.skip(skips.needs_cpus(4))`.
"""

import os
import re
import shutil
import subprocess

import pytest

STRICT_ENV = "KBERT_STRICT_SKIPS"

# Where tests run as root without util-linux's setpriv to drop root's
# file-permission capabilities, nothing can be made read-only to them.
NO_UNPRIVILEGED_PROCESS = "needs a process that read-only folders hold back: not root, or root and setpriv"


def cpu_only(why):
    """The reason for a test that an accelerator makes meaningless, saying `why`."""
    return f"needs a CPU-only machine: {why}"


def needs_gpu(why):
    """The reason for a test that needs a GPU, saying `why`."""
    return f"needs a GPU: {why}"


def needs_cpus(count):
    """The reason for a test that needs `count` CPUs on a machine with fewer."""
    return f"needs {count} CPUs; this machine has {os.cpu_count()}"


# Where an accelerator is present the device, not the CPU's flags, decides (kbert.hardware).
ACCELERATOR = cpu_only("an accelerator decides here, not the CPU's flags")

# Each allowed reason as it reads, and the pattern it is matched whole against.
ALLOWED = {
    "needs a CPU-only machine: WHY": r"needs a CPU-only machine: .+",
    "needs a GPU: WHY": r"needs a GPU: .+",
    "needs N CPUs; this machine has M": r"needs \d+ CPUs; this machine has \d+",
    NO_UNPRIVILEGED_PROCESS: re.escape(NO_UNPRIVILEGED_PROCESS),
}


def unprivileged_prefix():
    """The command prefix that runs a process which read-only folders hold back.

    Root writes anywhere through its CAP_DAC_OVERRIDE capability, and CI runs as
    root. As root the prefix is util-linux's setpriv without that capability,
    CAP_DAC_READ_SEARCH and CAP_FOWNER: still uid 0, so the process reads the venv,
    HOME and pytest's folders (the venv's Python may live under /root, mode 700,
    which the user nobody cannot enter), but the mode bits bind it. Not root: no
    prefix. Skips with `NO_UNPRIVILEGED_PROCESS` where neither works.
    """
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    prefix = [setpriv, "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search,-fowner"]
    # A container without CAP_SETPCAP cannot drop capabilities.
    if setpriv is None or subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip(NO_UNPRIVILEGED_PROCESS)
    return prefix


def allowed(reason):
    """Whether a skip's `reason` is one of `ALLOWED`."""
    return any(re.fullmatch(pattern, reason) for pattern in ALLOWED.values())


def skip_reason(report):
    """The reason of a skipped test's report, without pytest's "Skipped: " prefix."""
    longrepr = report.longrepr
    # A skip's longrepr is (file, line, "Skipped: reason"); a list once it has
    # crossed from a pytest-xdist worker.
    reason = longrepr[2] if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


class StrictSkips:
    """Collects the skips whose reason is not allowed; fails the session if there are any."""

    def __init__(self):
        self.unexpected = []

    def pytest_runtest_logreport(self, report):
        if report.skipped and not hasattr(report, "wasxfail"):
            self._check(report)

    def pytest_collectreport(self, report):
        # A module that skips whole as it is imported (`pytest.importorskip` at its top).
        if report.skipped:
            self._check(report)

    def _check(self, report):
        reason = skip_reason(report)
        if not allowed(reason):
            self.unexpected.append((report.nodeid, reason))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        if self.unexpected and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED,
                                                 pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if not self.unexpected:
            return
        terminalreporter.section(f"skips not allowed under {STRICT_ENV}=1", red=True, bold=True)
        for nodeid, reason in self.unexpected:
            terminalreporter.line(f"{nodeid}: {reason}")
        terminalreporter.line("the allowed reasons (tests/skips.py): " + "; ".join(repr(r) for r in ALLOWED))


def pytest_configure(config):
    # Under pytest-xdist the controller sees every worker's reports: check there alone.
    if os.environ.get(STRICT_ENV) == "1" and not hasattr(config, "workerinput"):
        config.pluginmanager.register(StrictSkips(), "kbert-strict-skips")
