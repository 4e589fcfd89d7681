"""The functions an allocator's module publishes beside it (SPEC 2.5: the page count a
scheduler sizes a paged batch by; the layout kernels' torch stand-ins) are held to the
model and to the allocator's own calls on every paged extend and decode."""

import pytest

from properties import observe
from properties.lockstep import Lockstep, LockstepFailure, replay
from properties.steps import Admit, Decode, Empty, Extend
from properties.targets import resolve
from tests.properties import module_fn_targets as faulty

CONFIG = {"kind": "hybrid", "size": 64, "size_swa": 64, "page_size": 4, "check_level": "strict"}
# Two requests from prefix 0 (3 pages), a chunk that continues one's page and opens
# another, a decode inside the pages and one that opens a page, then an extend and a
# decode of no requests.
STEPS = [Admit(((0, 5), (1, 4))), Extend(((0, 2), (1, 1))), Decode((0, 1)), Decode((0, 1)),
         Empty("alloc_extend"), Empty("alloc_decode")]


@pytest.fixture
def fault(monkeypatch):
    def set_fault(name):
        monkeypatch.setattr(faulty, "FAULT", name)
    return set_fault


def test_the_bundled_impl_offers_them_all_and_agrees():
    ls = Lockstep(CONFIG, resolve("impl"))
    assert set(ls.module_fns) == set(observe.MODULE_FUNCTIONS)
    ls = replay(CONFIG, STEPS, resolve("impl"))
    cells = {cell for (method, cell), n in ls.shapes.items() if n and method in observe.MODULE_FUNCTIONS}
    assert cells == {"extend", "decode", "new pages: some", "new pages: none"}, cells


def test_the_functions_are_found_in_the_allocators_module(fault):
    fault(None)
    ls = replay(CONFIG, STEPS, faulty.make)
    assert ls.module_fns["get_num_new_pages"] is faulty.get_num_new_pages


@pytest.mark.parametrize("name, invariant, words, at", [
    ("page count", "pool.capacity", "get_num_new_pages is 2 for prefix_lens [0, 0], seq_lens [5, 4] at page size 4, the model says 3", 0),
    ("extend stand-in", "alloc.layout", "alloc_extend_naive, given the 3 pages alloc_extend took, lays out", 0),
    ("decode stand-in", "alloc.layout", "alloc_decode_naive, given the 0 pages alloc_decode took", 2),
    ("empty batch count", "pool.capacity", "get_num_new_pages is 1 for prefix_lens [], seq_lens [] at page size 4, the model says 0", 4),
])
def test_a_wrong_module_function_fails_the_step_that_asked_it(fault, name, invariant, words, at):
    fault(name)
    with pytest.raises(LockstepFailure) as failed:
        replay(CONFIG, STEPS, faulty.make)
    got = failed.value
    assert (got.invariant, got.index) == (invariant, at) and words in str(got), str(got)


def test_a_wrong_ring_test_fails_the_census(fault):
    """is_swa_req_ring(allocator) must say what the configuration asked: its callers
    budget the SWA side by request rings where it says yes."""
    fault("ring test")
    with pytest.raises(LockstepFailure) as failed:
        replay(CONFIG, STEPS[:1], faulty.make)
    got = failed.value
    assert got.invariant == "pool.capacity" and "is_swa_req_ring(allocator) is True, the configuration's ring_size is None" in str(got), str(got)
    fault(None)
    replay(CONFIG, STEPS, faulty.make)
