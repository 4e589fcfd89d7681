"""The drawn pool sizes spread over every power of two between the smallest and the
largest pool (SPEC 4.1 scale), at page size 1 where a page is a slot: a fault that
starts at a table's or a dtype's bound (2^12 pages, 2^15 or 2^16 slots) must not sit
in a gap the generator steps over."""

from collections import Counter

from hypothesis import HealthCheck, given, settings

from properties.machine import LARGE_SLOTS, configs


def _draw(n: int, fixed: dict | None = None) -> list[dict]:
    seen: list[dict] = []

    @settings(max_examples=n, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(configs(fixed=fixed))
    def collect(config):
        seen.append(config)

    collect()
    return seen


def test_page_size_1_pools_reach_every_power_of_two_band():
    drawn = _draw(2000, {"page_size": 1})
    bands = Counter(c["size"].bit_length() - 1 for c in drawn)
    # tiny pools (2-12 pages), medium (2^6 to 2^12 pages), large (2^15 to 2^17 slots)
    wanted = [1, 2, 3, *range(6, 13), 15, 16, 17]
    missing = [b for b in wanted if not bands[b]]
    assert not missing, f"no page size 1 pool of 2^b to 2^(b+1) slots for b in {missing}; drawn: {sorted(bands.items())}"
    # The top band keeps the scale: over 70,000 pages at page size 1.
    assert sum(c["size"] > 70_000 for c in drawn) >= 10, sorted(bands.items())
    assert max(c["size"] for c in drawn) < LARGE_SLOTS + 8


def test_no_pool_holds_more_slots_than_the_largest():
    """At every page size the largest pool is about LARGE_SLOTS slots (a medium pool of
    a large page size is capped there too): the step budget is sized for it."""
    drawn = _draw(1000)
    assert len({c["page_size"] for c in drawn}) > 5
    for c in drawn:
        ps = c["page_size"]
        assert c["size"] < (LARGE_SLOTS // ps + 8) * ps, c
