"""Fixtures every test shares."""

import pytest

from impl import invariants


@pytest.fixture(autouse=True)
def _isolated_invariants():
    """Each test starts at the environment's invariant level with zero hit counts, and
    leaves them so: the level and the counters are process-wide."""
    invariants.set_level(None)
    invariants.reset_hits()
    yield
    invariants.set_level(None)
    invariants.reset_hits()
