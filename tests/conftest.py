"""Plugins of the whole suite: the check that a run skips only for an allowed reason."""

from tests.skips import pytest_configure  # noqa: F401  (a hook: registers the check)
