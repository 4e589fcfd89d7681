"""Shared fixtures for the impl unit tests."""

import os
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from impl import invariants  # noqa: E402


@pytest.fixture(autouse=True)
def _isolated_invariants():
    """Each test starts at the environment's level with zero hit counts."""
    invariants.set_level(None)
    invariants.reset_hits()
    yield
    invariants.set_level(None)
    invariants.reset_hits()
