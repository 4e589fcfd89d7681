"""The workload steps for sglang 0.5.23's free_swa_segment and free_page_ids, and
debug mode in the lockstep: what is legal, what is a break, what a broken allocator trips."""

import pytest
import torch

from impl.paged import PagedTokenToKVPoolAllocator
from impl.swa import SWATokenToKVPoolAllocator
from properties.lockstep import LockstepFailure, replay
from properties.steps import (
    Admit, AdmitTail, Break, Decode, Evict, EvictSegment, Extend, Finish, FreePages, GroupBegin,
    GroupEnd, Repair,
)
from properties.targets import resolve
from reference import Model, names

IMPL = resolve("impl")
BASE = {"kind": "hybrid", "size": 48, "size_swa": 48, "page_size": 4, "check_level": "strict"}


def run(*steps, target=IMPL, **cfg):
    return replay({**BASE, **cfg}, list(steps), target)


# ------------------------------------------------------------ legal workloads

LEGAL = [
    # Window eviction by segment, then the rest of the row; then a finished request's
    # evicted pages go back by page id.
    (Admit(((0, 10), (1, 7))), EvictSegment(0, 0, 4), Decode((0, 1)), EvictSegment(0, 4, 8),
     Extend(((1, 5),)), Finish(0, "free"), EvictSegment(1, 0, 13), FreePages(1, 0)),
    # Inside a group, with a load-back into evicted pages and a tail eviction that
    # ends mid-page.
    (Admit(((0, 12),)), GroupBegin(), EvictSegment(0, 0, 6), Repair(0, 0, 4, 0), GroupEnd(),
     EvictSegment(0, 0, 4), Decode((0,)), Finish(0, "split")),
    # A tail drop by page id after its window went, the row goes on.
    (Admit(((0, 9),)), EvictSegment(0, 4, 9), FreePages(0, 4), Extend(((0, 6),)), Finish(0, "free")),
]


@pytest.mark.parametrize("steps", LEGAL, ids=["segments", "group", "tail_pages"])
@pytest.mark.parametrize("ps", [1, 4])
@pytest.mark.parametrize("level", ["strict", "warn", "off"])
@pytest.mark.parametrize("debug", [False, True])
def test_legal_segment_and_page_id_workloads_pass(steps, ps, level, debug):
    steps = [s for s in steps if ps > 1 or not isinstance(s, Repair) or s.offset == 0]
    ls = run(*steps, page_size=ps, check_level=level, debug_memory_pool=debug)
    assert not ls.counters()["runs_restarted"]
    refused = [k for k in ls.labels if k.startswith(("contract refused", "contract break", "workload step breaks"))]
    assert not refused, refused
    assert ls.labels["window evicted by segment"] >= 1
    assert ls.labels["freed by page id"] == sum(isinstance(s, FreePages) for s in steps)


def test_pure_swa_and_ring_take_the_new_steps():
    ls = run(Admit(((0, 10),)), EvictSegment(0, 0, 3), FreePages(0, 5), FreePages(0, 0),
             kind="pure_swa", page_size=1, size=16, size_swa=16)
    assert ls.labels["freed by page id"] == 2 and not ls.rows
    ls = run(Admit(((0, 10),)), EvictSegment(0, 0, 8), FreePages(0, 4), Decode((0,)), FreePages(0, 0),
             ring_size=4, req_slots=2)
    assert ls.labels["freed by page id"] == 2 and not ls.rows


def test_pure_swa_page_id_free_inside_a_group_is_not_held():
    # The pure SWA allocator's group is its own; its one sub-allocator has none
    # open, so a page-id free straight to it releases at once (as in sglang).
    ls = run(Admit(((0, 6),)), GroupBegin(), FreePages(0, 2), Admit(((1, 12),)), GroupEnd(), Finish(1, "free"),
             kind="pure_swa", page_size=1, size=16, size_swa=16)
    assert ls.labels["freed by page id"] == 1 and ls.labels["finished by free"] == 1


# ------------------------------------------------------------ contract breaks


def test_segment_over_a_dead_representative_is_peer_mapped_at_every_level():
    steps = (Admit(((0, 10),)), EvictSegment(0, 0, 8), EvictSegment(0, 4, 10))
    for level in ("strict", "warn"):
        ls = run(*steps, check_level=level)
        assert ls.labels["contract refused: swa_segment.unpaired_rep"] == 1 and not ls.counters()["runs_restarted"]
    ls = run(*steps, check_level="off")
    assert ls.restarted_because and "accepted at level off" in ls.restarted_because
    # Debug mode's own check refuses it where the guard is off.
    ls = run(*steps, check_level="off", debug_memory_pool=True)
    assert ls.labels["contract refused: swa_segment.unpaired_rep"] == 1 and not ls.counters()["runs_restarted"]


def test_segment_over_a_page_paired_out_of_step_is_refused_only_in_debug_mode():
    steps = (Admit(((0, 8),)), Evict(0, 0, 4), Repair(0, 0, 4, 2), EvictSegment(0, 0, 4))
    assert run(*steps).labels["workload step breaks a contract, not sent: swa_segment.not_in_step"] == 1
    assert run(*steps, debug_memory_pool=True).labels["contract refused: swa_segment.not_in_step"] == 1


def test_unaligned_segment_start_is_refused():
    ls = run(Admit(((0, 8),)), EvictSegment(0, 2, 8))
    assert ls.labels["contract refused: segment.unaligned"] == 1 and ls.rows[0].slots


@pytest.mark.parametrize("kind, contract", [
    ("page_ids_twice", "page_ids.twice"), ("page_ids_padding", "page_ids.padding"), ("page_ids_free", "page_ids.double"),
])
def test_page_id_breaks_need_not_be_noticed_unless_debug_mode(kind, contract):
    steps = (Admit(((0, 6),)), Break(kind, 0), Finish(0, "free"))
    not_sent = f"contract break not sent: {kind} ({contract})"
    assert run(*steps).labels[not_sent] == 1
    ls = run(*steps, debug_memory_pool=True)
    assert ls.labels[f"contract refused: {contract}"] == 1 and ls.labels["finished by free"] == 1
    # Inside a group debug mode checks only at the end, so nothing is sent.
    ls = run(Admit(((0, 6),)), GroupBegin(), Break(kind, 0), GroupEnd(), debug_memory_pool=True)
    assert ls.labels[not_sent] == 1
    # Page size 1 has no debug checks, as in sglang 0.5.23.
    ls = run(*steps, page_size=1, debug_memory_pool=True)
    assert ls.labels[not_sent] == 1


def test_double_free_is_refused_in_debug_mode_at_paged_sizes():
    steps = (Admit(((0, 6),)), Finish(0, "free"), Break("double_free"), Break("never_allocated"))
    labels = run(*steps).labels
    assert labels["contract break not sent: double_free (free.double)"] == 1
    assert labels["contract break not sent: never_allocated (free.double)"] == 1
    assert run(*steps, debug_memory_pool=True).labels["contract refused: free.double"] == 2


def test_page_ids_over_paired_positions_is_a_break_never_sent():
    ls = run(Admit(((0, 10),)), FreePages(0, 4), Finish(0, "free"))
    assert ls.labels["workload step breaks a contract, not sent: page_ids.paired"] == 1 and ls.labels["finished by free"] == 1


def test_model_classifies_the_new_calls():
    m = Model("hybrid", 32, 32, 4)
    full = list(range(4, 14))  # positions 0..9 on pages 1..3
    assert not m.alloc_extend([0], [10], [-1], full, list(range(4, 14)), [0])
    assert m.classify_free_swa_segment(full[:8], 0, 0) is None
    c = m.classify_free_swa_segment(full[2:], 2, 0)
    assert (c.name, c.reaction) == ("segment.unaligned", names.ERROR)
    m.free("free_swa_segment", full[:4])
    c = m.classify_free_swa_segment(full, 0, 0)
    assert (c.name, c.reaction, c.debug_refuses) == ("swa_segment.unpaired_rep", names.PEER_MAPPED, True)
    assert m.swa.free == {1, 4, 5, 6, 7, 8}
    c = m.classify_free_page_ids([1], full[:4], 0)
    assert c is None
    m.free_page_ids(full[:4])
    assert 1 in m.full.free
    c = m.classify_free_page_ids([1], [], 0)
    assert (c.name, c.reaction, c.debug_refuses) == ("page_ids.double", names.UNNOTICED, True)
    m.group_begin()
    assert m.classify_free_page_ids([1], [], 0).debug_refuses is False


# ------------------------------------------------------------ broken allocators are caught


def _rebind(a, sub_attr, cls):
    target = getattr(a, sub_attr) if sub_attr else a
    target.__class__ = type(cls.__name__, (cls, type(target)), {})
    return a


class _SegmentClearsRepsOnly(SWATokenToKVPoolAllocator):
    """free_swa_segment clears the mapping of the representatives only: the rest of
    each page keeps peers into a released SWA page."""

    def free_swa_segment(self, free_index, *, start_pos):
        reps = free_index[:: self.page_size].to(torch.int64)
        swa_pages = self.full_to_swa_index_mapping[reps] // self.page_size
        self.clear_full_to_swa_mapping(reps)
        self.swa_attn_allocator.free_page_ids(swa_pages)


class _PageIdsDropLast(PagedTokenToKVPoolAllocator):
    """free_page_ids releases all but the last page it is given."""

    def free_page_ids(self, page_ids):
        super().free_page_ids(page_ids[:-1])


class _SegmentNotHeld(SWATokenToKVPoolAllocator):
    """free_swa_segment releases its SWA pages at once even inside a free group."""

    def free_swa_segment(self, free_index, *, start_pos):
        group, self.free_group = self.free_group, None
        try:
            super().free_swa_segment(free_index, start_pos=start_pos)
        finally:
            self.free_group = group


class _DebugMissesTwice(PagedTokenToKVPoolAllocator):
    """Debug mode's check of free_page_ids forgets duplicates."""

    def _debug_check_release(self, page_ids, what):
        super()._debug_check_release(torch.unique(page_ids), what)


@pytest.mark.parametrize(
    "name, make, steps, cfg, invariant",
    [
        ("segment clears reps only", lambda a: _rebind(a, None, _SegmentClearsRepsOnly),
         (Admit(((0, 8),)), EvictSegment(0, 0, 4)), {}, names.MAP_LIVE),
        ("free_page_ids drops a page", lambda a: _rebind(a, "full_attn_allocator", _PageIdsDropLast),
         (Admit(((0, 8),)), EvictSegment(0, 0, 8), FreePages(0, 0)), {}, names.NO_LEAK),
        ("segment ignores the group", lambda a: _rebind(a, None, _SegmentNotHeld),
         (Admit(((0, 8),)), GroupBegin(), EvictSegment(0, 0, 4)), {}, names.GROUP_DEFERRED),
        ("debug misses a page named twice", lambda a: _rebind(a, "full_attn_allocator", _DebugMissesTwice),
         (Admit(((0, 8),)), Break("page_ids_twice", 0)), {"debug_memory_pool": True}, "contract.page_ids.twice"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_a_broken_allocator_is_caught_through_the_new_steps(name, make, steps, cfg, invariant):
    target = lambda config: make(IMPL(config))
    with pytest.raises(LockstepFailure) as e:
        run(*steps, target=target, **cfg)
    assert e.value.invariant == invariant, str(e.value)
    run(*steps, **cfg)  # the bundled allocator passes the same trace


# ------------------------------------------------------------ probing, not versions


class _SeedEra:
    """An allocator with the seed's API only: no free_swa_segment, no free_page_ids."""

    HIDDEN = ("free_swa_segment", "free_page_ids")

    def __init__(self, inner, calls):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_calls", calls)

    def __getattr__(self, name):
        if name in self.HIDDEN:
            raise AttributeError(name)
        value = getattr(self._inner, name)
        if name in ("full_attn_allocator", "swa_attn_allocator"):
            return _SeedEra(value, self._calls)
        if callable(value) and name.startswith("free"):
            self._calls.append(name)
        return value


def test_a_target_without_the_new_methods_gets_the_seed_era_calls():
    calls: list[str] = []
    steps = (Admit(((0, 10),)), EvictSegment(0, 0, 8), EvictSegment(0, 8, 10), FreePages(0, 4), Finish(0, "free"))
    ls = run(*steps, target=lambda c: _SeedEra(IMPL(c), calls))
    assert ls.labels["window evicted by segment"] == 2 and ls.labels["freed by page id"] == 1
    assert calls.count("free_swa") == 2 and "free" in calls
    assert not ls.rows
