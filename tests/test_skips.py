"""tests/skips.py: under KBERT_STRICT_SKIPS=1 a run fails when a test skips for a reason
that is not a machine's hardware, in one process or across pytest-xdist's workers; and the
prefix that runs a process read-only folders hold back."""

import os
import subprocess

import pytest

from tests import skips

pytest_plugins = ["pytester"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFTEST = os.path.join(ROOT, "tests", "conftest.py")

ALLOWED_SKIPS = """
import pytest
from tests import skips

def test_proves_something():
    assert True

def test_on_an_accelerator():
    pytest.skip(skips.ACCELERATOR)

def test_on_a_small_machine():
    pytest.skip(skips.needs_cpus(4096))

@pytest.mark.skipif(True, reason=skips.needs_gpu("bfloat16 tensor cores"))
def test_on_a_gpu():
    pass
"""

# The ways a test loses its reference: a library gone, a mark, a fixture's skip.
OTHER_SKIPS = """
import pytest

@pytest.fixture
def reference():
    pytest.skip("data/reference.npz is not in this checkout")

def test_against_transformers():
    pytest.importorskip("a_module_no_extra_declares")

@pytest.mark.skipif(True, reason="torch and transformers not installed")
def test_against_torch():
    pass

def test_as_root():
    pytest.skip("root writes in read-only folders")

def test_against_a_file(reference):
    pass

def test_proves_something():
    assert True
"""

# A module that skips whole at import: a skip at collection, not in a test.
SKIPPED_MODULE = """
import pytest

keras_hub = pytest.importorskip("a_module_no_extra_declares")

def test_interop():
    pass
"""


@pytest.fixture
def suite(pytester, monkeypatch):
    """A pytester folder with the suite's own conftest.py, able to import `tests`."""
    with open(CONFTEST, encoding="utf-8") as f:
        pytester.makeconftest(f.read())
    monkeypatch.setenv("PYTHONPATH", ROOT)
    return pytester


def test_allowed_reasons_pass(suite, monkeypatch):
    monkeypatch.setenv(skips.STRICT_ENV, "1")
    suite.makepyfile(test_hardware=ALLOWED_SKIPS)
    result = suite.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=3)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.no_fnmatch_line("*skips not allowed*")


def test_other_reasons_fail_the_run_and_are_named(suite, monkeypatch):
    monkeypatch.setenv(skips.STRICT_ENV, "1")
    suite.makepyfile(test_references=OTHER_SKIPS, test_hardware=ALLOWED_SKIPS)
    result = suite.runpytest()
    result.assert_outcomes(passed=2, skipped=7)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*skips not allowed under KBERT_STRICT_SKIPS=1*",
        "test_references.py::test_against_transformers: could not import 'a_module_no_extra_declares'*",
        "test_references.py::test_against_torch: torch and transformers not installed",
        "test_references.py::test_as_root: root writes in read-only folders",
        "test_references.py::test_against_a_file: data/reference.npz is not in this checkout",
        "the allowed reasons (tests/skips.py): *",
    ])
    result.stdout.no_fnmatch_line("test_hardware.py::*")


def test_a_module_skipped_at_import_fails_the_run(suite, monkeypatch):
    monkeypatch.setenv(skips.STRICT_ENV, "1")
    suite.makepyfile(test_interop=SKIPPED_MODULE)
    result = suite.runpytest()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["test_interop.py: could not import 'a_module_no_extra_declares'*"])


def test_a_failure_stays_a_failure(suite, monkeypatch):
    monkeypatch.setenv(skips.STRICT_ENV, "1")
    suite.makepyfile(test_references=OTHER_SKIPS + "\ndef test_wrong():\n    assert False\n")
    result = suite.runpytest()
    result.assert_outcomes(passed=1, failed=1, skipped=4)
    assert result.ret == pytest.ExitCode.TESTS_FAILED


@pytest.mark.parametrize("value", [None, "0"])
def test_without_the_variable_a_skip_is_a_skip(suite, monkeypatch, value):
    """A developer running one file by hand."""
    if value is None:
        monkeypatch.delenv(skips.STRICT_ENV, raising=False)
    else:
        monkeypatch.setenv(skips.STRICT_ENV, value)
    suite.makepyfile(test_references=OTHER_SKIPS, test_interop=SKIPPED_MODULE)
    result = suite.runpytest()
    result.assert_outcomes(passed=1, skipped=5)
    assert result.ret == pytest.ExitCode.OK


def test_skips_on_xdist_workers_fail_the_run(suite, monkeypatch):
    """As `make test` runs: in two worker processes, whose reports reach the controller."""
    monkeypatch.setenv(skips.STRICT_ENV, "1")
    suite.makepyfile(test_references=OTHER_SKIPS, test_hardware=ALLOWED_SKIPS)
    result = suite.runpytest_subprocess("-n", "2", "-p", "xdist", timeout=120)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*skips not allowed under KBERT_STRICT_SKIPS=1*"])
    lines = [line for line in result.stdout.lines if line.startswith("test_") and ": " in line]
    assert sorted(line.split(":")[2] for line in lines) == [
        "test_against_a_file", "test_against_torch", "test_against_transformers", "test_as_root"]


def test_the_makefile_test_targets_set_the_variable():
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        makefile = f.read()
    (line,) = [line for line in makefile.splitlines() if line.startswith("PYTEST :=")]
    assert line.startswith(f"PYTEST := {skips.STRICT_ENV}=1 ")
    for target in ("test:", "test-slow:"):
        recipe = makefile[makefile.index(f"\n{target}"):].split("\n\n")[0]
        assert "\t$(PYTEST) " in recipe, target


def test_the_unprivileged_prefix_is_held_back_by_a_read_only_folder(tmp_path):
    """What tests of read-only outputs run under: refused where this process (root, in CI) is not."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        held = subprocess.run([*skips.unprivileged_prefix(), "touch", str(locked / "held")], capture_output=True)
        free = subprocess.run(["touch", str(locked / "free")], capture_output=True)
    finally:
        locked.chmod(0o755)
    assert held.returncode != 0 and not (locked / "held").exists()
    assert (free.returncode == 0) == (os.geteuid() == 0)
