"""The lockstep machine finds every seeded-bug variant (SPEC 7, SPEC 2.9) on each of
five seeds, and names one of the invariants EXPECTED names.

The machine runs unchanged against each variant: no rule, weight or configuration is
bent toward a bug. Each (variant, seed) search gets the same example budget, well
above the worst examples-to-find measured; a variant counts as found only if every
seed finds it. The worst examples-to-find per variant goes to the terminal summary.
Shrinking is left out: it belongs to the benchmark (bench/variants.py) and the
corpus. The searches run in parallel processes, one per core.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os

import pytest

from fuzz.variants import EXPECTED, VARIANTS
from impl import invariants, make_allocator
from properties.lockstep import LockstepFailure, replay
from properties.targets import resolve

SEEDS = (0, 1, 2, 3, 4)
# Examples per (variant, seed); the worst measured is reported beside it. 1000 was
# raised when the harness's new checks moved the searches' draws (hypothesis mixes the
# project's literal constants into them) and decode_pages_sorted_order went past 1000
# on one seed. 2500 when busy servers began to draw serving and production pools, and
# seed_tail_zero_stale took 1,599 counted draws on one seed (it needs a tolerated
# free_full and a recycled page; a larger pool recycles later). A found variant stops
# early, so the budget costs time only where a search is near it.
BUDGET = 2500

# Variants the machine did not find on every seed within BUDGET, with the chain of
# moves each needs (the seeds measured are in the README). Not strict: a generator change moves what
# each seed draws, and a variant found on every seed must then say so (XPASS).
NOT_ON_EVERY_SEED: dict[str, str] = {}

# A config on which every variant's bug is live (hybrid, paged, no ring), and one in
# ring mode for the ring variants.
_PAGED = {"kind": "hybrid", "size": 64, "size_swa": 64, "page_size": 4}
_RING = dict(_PAGED, ring_size=5, req_slots=3)


def search(name: str, seed: int) -> tuple:
    """One search in a fresh process: (name, seed, examples run until found or None,
    the invariant reported, the failure's first line, its trace as (config, steps))."""
    import torch
    from hypothesis import Phase, seed as hyp_seed, settings
    from hypothesis.stateful import run_state_machine_as_test

    from properties import profiles  # noqa: F401  (the project's `ci`, not hypothesis's own)
    from properties.lockstep import LockstepFailure, Observer, observing
    from properties.machine import machine_for

    torch.set_num_threads(1)
    invariants.set_level(None)
    invariants.reset_hits()

    class Examples(Observer):
        n = 0

        def started(self, ls):
            Examples.n += 1

    ci = settings.get_profile("ci")
    s = settings(ci, max_examples=BUDGET, derandomize=False, database=None, phases=[Phase.generate])
    try:
        with observing(Examples()):
            run_state_machine_as_test(hyp_seed(seed)(machine_for(VARIANTS[name])), settings=s)
    except LockstepFailure as e:
        return name, seed, Examples.n, e.invariant, str(e).splitlines()[0], (e.config, e.steps)
    return name, seed, None, None, "", None


@pytest.fixture(scope="module")
def searches(variant_report):
    jobs = [(name, seed) for name in sorted(VARIANTS) for seed in SEEDS]
    with cf.ProcessPoolExecutor(max_workers=max(1, os.cpu_count() or 1), mp_context=mp.get_context("spawn")) as pool:
        done = list(pool.map(search, *zip(*jobs)))
    out = {}
    for name, seed, n, inv, line, trace in done:
        out.setdefault(name, {})[seed] = (n, inv, line, trace)
    for name in sorted(out):
        runs = out[name]
        found = [n for n, *_ in runs.values() if n is not None]
        worst = f"{max(found)}" if len(found) == len(SEEDS) else f"not found on {len(SEEDS) - len(found)} seeds"
        variant_report.append(f"{name}: worst {worst} of {BUDGET} examples over seeds {SEEDS}; each: {[runs[s][0] for s in SEEDS]}")
    return out


def test_bundled_impl_is_not_a_variant():
    impl = resolve("impl")
    assert impl not in VARIANTS.values()
    assert make_allocator not in VARIANTS.values()
    assert "impl" not in VARIANTS


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_class_differs_from_impl(name):
    cfg = _RING if name.startswith("ring_") else _PAGED
    impl = make_allocator(dict(cfg))
    a = VARIANTS[name](dict(cfg))
    assert type(a) is not type(impl)
    assert isinstance(a, type(impl))
    assert a.variant == name


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.xfail(reason=NOT_ON_EVERY_SEED[n], strict=False)) if n in NOT_ON_EVERY_SEED else n
     for n in sorted(VARIANTS)],
)
def test_machine_finds_variant_on_every_seed(name, searches):
    """Within the budget on each seed, with no help from the generator, under one of
    the invariants EXPECTED names for it."""
    runs = searches[name]
    missed = [seed for seed, (n, *_) in runs.items() if n is None]
    assert not missed, f"{name}: not found within {BUDGET} examples on seeds {missed}"
    wrong = {seed: line for seed, (_, inv, line, _) in runs.items() if inv not in EXPECTED[name]}
    assert not wrong, f"{name}: reported outside {EXPECTED[name]}: {wrong}"
    # Each failure is the variant's, not the harness's: its trace replays to the same
    # invariant on the variant and passes on the bundled impl.
    for seed, (_, inv, line, (config, steps)) in runs.items():
        with pytest.raises(LockstepFailure) as failed:
            replay(config, steps, VARIANTS[name])
        assert failed.value.invariant == inv, f"{name} seed {seed}: replay names {failed.value.invariant}, the search {line}"
        replay(config, steps, resolve("impl"))
