"""The lockstep machine finds every seeded-bug variant (SPEC 7, SPEC 2.9) and names
one of the invariants EXPECTED names, under the hypothesis profile the root conftest loads.

The machine runs unchanged against each variant: no rule, weight or configuration is
bent toward a bug. Shrinking is left out here: it costs ten to a hundred times the
search and belongs to the benchmark (bench/variants.py) and the corpus; this test
asserts that the search finds the bug and what it calls it.
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from fuzz.variants import AWAITING_WORKLOAD, EXPECTED, VARIANTS
from impl import invariants, make_allocator
from properties.lockstep import LockstepFailure
from properties.machine import machine_for
from properties.targets import resolve
from reference import names

# A config on which every variant's bug is live (hybrid, paged, no ring), and one in
# ring mode for the ring variants.
_PAGED = {"kind": "hybrid", "size": 64, "size_swa": 64, "page_size": 4}
_RING = dict(_PAGED, ring_size=5, req_slots=3)


@pytest.fixture(autouse=True)
def _isolated_invariants():
    invariants.set_level(None)
    invariants.reset_hits()
    yield
    invariants.set_level(None)
    invariants.reset_hits()


def _search_settings() -> settings:
    # The claim is about the ci profile's budget, whichever profile this run loaded.
    ci = settings.get_profile("ci")
    return settings(ci, database=None, phases=[p for p in ci.phases if p not in (Phase.shrink, Phase.explain)])


def test_bundled_impl_is_not_a_variant():
    impl = resolve("impl")
    assert impl not in VARIANTS.values()
    assert make_allocator not in VARIANTS.values()
    assert "impl" not in VARIANTS


# SPEC 3.3 names whose checks come with the scheduler-shaped workload; until
# reference/names.py has them only variants awaiting that workload may expect them.
_NAMES_TO_COME = ("kv.resolve", "alloc.dtype")


def test_expected_names_real_invariants():
    assert set(EXPECTED) == set(VARIANTS)
    assert AWAITING_WORKLOAD <= set(VARIANTS)
    for name, invs in EXPECTED.items():
        for inv in invs:
            to_come = name in AWAITING_WORKLOAD and inv in _NAMES_TO_COME
            assert inv in names.INVARIANTS or inv == "crash" or inv.startswith("contract.") or to_come, (name, inv)


def test_every_invariant_is_first_reported_by_a_variant_the_machine_finds():
    assert sorted(set(names.INVARIANTS) - {invs[0] for invs in EXPECTED.values()}) == []


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_class_differs_from_impl(name):
    cfg = _RING if name.startswith("ring_") else _PAGED
    impl = make_allocator(dict(cfg))
    a = VARIANTS[name](dict(cfg))
    assert type(a) is not type(impl)
    assert isinstance(a, type(impl))
    assert a.variant == name


@pytest.mark.parametrize("name", sorted(set(VARIANTS) - AWAITING_WORKLOAD))
def test_machine_finds_variant(name):
    """Within the profile's budget (ci: deterministic), with no help from the generator."""
    with pytest.raises(LockstepFailure) as info:
        run_state_machine_as_test(machine_for(VARIANTS[name]), settings=_search_settings())
    failure = info.value
    assert failure.invariant in EXPECTED[name], f"{name}: {failure}"
    # The trace that replays it (empty when the allocator is wrong from construction).
    assert failure.steps is not None and failure.config is not None
