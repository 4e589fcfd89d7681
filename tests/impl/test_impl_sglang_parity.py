"""sglang 0.5.23's allocator API on the impl: alloc_extend_naive, free_page_ids,
free_swa_segment, SGLANG_DEBUG_MEMORY_POOL, and the attributes sglang's code reads."""

import logging
from unittest import mock

import pytest
import torch
from impl_testlib import T, decode, extend, free_set, hybrid, tail

from impl import debug, invariants, make_allocator
from impl.base import PageAlignmentError
from impl.invariants import InvariantViolation
from impl.paged import (
    PagedTokenToKVPoolAllocator,
    alloc_decode_naive,
    alloc_extend_naive,
    extend_layout,
)
from impl.swa import SWATokenToKVPoolAllocator
from impl.token import TokenToKVPoolAllocator
from properties import observe


@pytest.fixture(autouse=True)
def _no_debug_override():
    debug.set_debug_memory_pool(None)
    yield
    debug.set_debug_memory_pool(None)


def token(size=8, need_sort=False):
    return TokenToKVPoolAllocator(size, torch.int64, "cpu", None, need_sort)


def paged(size=32, page_size=4, need_sort=False, dbg=False):
    with debug.override_debug_memory_pool(dbg):
        return PagedTokenToKVPoolAllocator(size, page_size, torch.int64, "cpu", None, need_sort)


def state(sub):
    return (sub.get_all_free_pages().tolist(), sub.available_size(), sub.free_group)


# ------------------------------------------------------------ alloc_extend_naive


def naive(prefix, seq, last, free_pages, ps=4):
    pre, sl = T(*prefix), T(*seq)
    out = torch.full((int((sl - pre).sum()),), -7, dtype=torch.int64)
    alloc_extend_naive(pre, sl, T(*last), T(*free_pages), out, ps, "cpu")
    return out.tolist()


@pytest.mark.parametrize(
    "prefix, seq, last, pages, want",
    [
        ([2], [4], [1], [], [2, 3]),  # continuation only
        ([0], [8], [-1], [5, 6], list(range(20, 28))),  # whole pages only
        ([4], [7], [3], [3], [12, 13, 14]),  # one partial page
        ([2], [11], [1], [3, 4], [2, 3, 12, 13, 14, 15, 16, 17, 18]),  # all three parts
        ([0, 2], [5, 3], [-1, 9], [7, 8], [28, 29, 30, 31, 32, 10]),  # two requests, pages in order
        ([4], [4], [3], [], []),
    ],
)
def test_alloc_extend_naive_fills_the_extend_layout(prefix, seq, last, pages, want):
    assert naive(prefix, seq, last, pages) == want


def test_alloc_extend_naive_agrees_with_the_allocators_own_extend():
    a = paged(size=64)
    a.alloc(8)  # pages 1, 2 gone; the free list now starts at page 3
    free_before = a.free_pages.clone()
    pre, sl, last = T(0, 3, 4), T(6, 9, 4), T(-1, 14, 19)
    got = torch.empty(12, dtype=torch.int64)
    alloc_extend_naive(pre, sl, last, free_before, got, 4, "cpu")
    assert got.tolist() == a.alloc_extend(pre, pre, sl, sl, last, 12).tolist()
    assert torch.equal(a.free_pages, free_before[4:])  # naive read 4 pages, the allocator took them


def test_alloc_extend_naive_refuses_an_empty_pool_when_pages_are_needed():
    with pytest.raises(AssertionError, match="free_pages is empty"):
        naive([0], [3], [-1], [])


def test_alloc_decode_naive():
    out = torch.empty(3, dtype=torch.int64)
    alloc_decode_naive(T(5, 3, 9), T(7, 10, 40), T(6, 9), out, 4, 2)
    assert out.tolist() == [24, 11, 36]
    alloc_decode_naive(T(3,), T(10,), T(), out[:1], 4, 0)
    assert out[0].item() == 11


# ------------------------------------------------------------ free_page_ids


def test_token_free_page_ids_frees_exactly_those_slots():
    a = token(6)
    a.alloc(6)
    a.free_page_ids(T(4, 2))
    assert free_set(a) == [2, 4] and a.available_size() == 2


@pytest.mark.parametrize("need_sort", [False, True])
def test_paged_free_page_ids_frees_exactly_those_pages(need_sort):
    a = paged(size=32, need_sort=need_sort)
    a.alloc(32)
    ids = T(7, 2, 5)
    a.free_page_ids(ids)
    ids.fill_(0)  # the allocator keeps its own copy
    assert free_set(a) == [2, 5, 7] and a.available_size() == 12
    assert a.alloc(12).tolist() == [p * 4 + i for p in ([2, 5, 7] if need_sort else [7, 2, 5]) for i in range(4)]


@pytest.mark.parametrize("make", [lambda: token(8), lambda: paged(size=32)], ids=["token", "paged"])
def test_free_page_ids_in_a_group_is_held_as_a_copy_until_the_end(make):
    a = make()
    a.alloc(a.available_size())
    a.free_group_begin()
    ids = T(3, 1)
    a.free_page_ids(ids)
    ids.fill_(0)
    assert a.available_size() == 0 and a.is_not_in_free_group is False
    a.free_group_end()
    assert free_set(a) == [1, 3] and a.is_not_in_free_group is True


def test_paged_free_segment_goes_through_free_page_ids_in_a_group():
    a = paged(size=32)
    x = a.alloc(12)
    a.free_group_begin()
    a.free_segment(x[4:10], start_pos=4)
    assert [t.tolist() for t in a.free_page_ids_group] == [[2, 3]]
    a.free_group_end()
    assert free_set(a) == [2, 3, 4, 5, 6, 7, 8]


# ------------------------------------------------------------ debug mode


@pytest.mark.parametrize(
    "value, on",
    [("1", True), ("true", True), ("TRUE", True), ("True", True), ("0", False),
     ("false", False), ("", False), ("yes", False), (None, False)],
)
def test_env_var_is_read_as_sglang_reads_it(value, on, monkeypatch):
    if value is None:
        monkeypatch.delenv(debug.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(debug.ENV_VAR, value)
    assert debug.debug_memory_pool() is on
    # Read once, at construction, as sglang's paged allocator does.
    a = PagedTokenToKVPoolAllocator(16, 4, torch.int64, "cpu", None, False)
    monkeypatch.setenv(debug.ENV_VAR, "0" if on else "1")
    assert a.debug_mode is on and hybrid().debug_mode is (not on)


def test_an_unknown_value_warns_once(monkeypatch, caplog):
    monkeypatch.setenv(debug.ENV_VAR, "maybe")
    monkeypatch.setattr(debug, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="impl.debug"):
        assert debug.debug_memory_pool() is False
        assert debug.debug_memory_pool() is False
    assert [r.getMessage() for r in caplog.records].count(
        "SGLANG_DEBUG_MEMORY_POOL='maybe' is not one of true/1/false/0; debug mode stays off"
    ) == 1


def test_override_beats_the_environment(monkeypatch):
    monkeypatch.setenv(debug.ENV_VAR, "1")
    with debug.override_debug_memory_pool(False):
        assert debug.debug_memory_pool() is False
        assert paged().debug_mode is False
    assert debug.debug_memory_pool() is True
    with pytest.raises(ValueError, match="bool"):
        debug.set_debug_memory_pool("1")


def test_factory_key_decides_whatever_the_environment_says(monkeypatch):
    monkeypatch.setenv(debug.ENV_VAR, "1")
    base = {"kind": "hybrid", "size": 32, "page_size": 4}
    a = make_allocator(base)
    assert a.debug_mode is False and a.full_attn_allocator.debug_mode is False
    b = make_allocator({**base, "debug_memory_pool": True})
    assert b.debug_mode is True and b.full_attn_allocator.debug_mode is True
    with pytest.raises(ValueError, match="debug_memory_pool"):
        make_allocator({**base, "debug_memory_pool": "yes"})


def test_unaligned_paged_alloc_raises_what_sglang_callers_catch():
    for dbg in (False, True):
        a = paged(dbg=dbg)
        for exc in (AssertionError, ValueError, PageAlignmentError):
            with pytest.raises(exc, match="multiple of page_size=4"):
                a.alloc(3)
        assert a.available_size() == 32


@pytest.mark.parametrize(
    "call, arg",
    [
        ("free", lambda x: x[:4]),  # page 1 again
        ("free_page_ids", lambda x: T(1)),  # page 1 again
        ("free_page_ids", lambda x: T(2, 2)),  # page 2 twice
        ("free_page_ids", lambda x: T(0)),  # the padding page
        ("free_page_ids", lambda x: T(9)),  # beyond the pool
        ("free_segment", lambda x: x[:6]),  # pages 1 (again) and 2
    ],
)
def test_debug_refuses_a_page_freed_twice_or_page_0_and_changes_nothing(call, arg):
    a = paged(size=32, dbg=True)
    x = a.alloc(12)
    a.free(x[:4])
    before = state(a)
    kw = {"start_pos": 0} if call == "free_segment" else {}
    with pytest.raises(AssertionError):
        getattr(a, call)(arg(x), **kw)
    assert state(a) == before
    # Off, the same call is the caller's contract break and nothing checks it.
    b = paged(size=32, dbg=False)
    y = b.alloc(12)
    b.free(y[:4])
    getattr(b, call)(arg(y), **kw)


def test_debug_refuses_a_duplicate_at_group_end_and_leaves_the_group_open():
    a = paged(size=32, dbg=True)
    x = a.alloc(8)
    a.free_group_begin()
    a.free(x[:4])
    a.free_page_ids(T(1))
    before = (free_set(a), a.available_size(), [t.tolist() for t in a.free_group], [t.tolist() for t in a.free_page_ids_group])
    with pytest.raises(AssertionError, match="named twice"):
        a.free_group_end()
    assert (free_set(a), a.available_size(), [t.tolist() for t in a.free_group], [t.tolist() for t in a.free_page_ids_group]) == before


def test_debug_layout_checks_let_aligned_continuations_through():
    # An aligned prefix whose last SWA peer was evicted translates to last_loc 0
    # on the SWA side; no row reads it, so debug mode must let it through.
    a = hybrid(size=32, size_swa=32, page_size=4)
    a.debug_mode = True
    full = extend(a, [0], [4], [-1])
    a.free_swa(full)
    got = extend(a, [4], [6], [full[-1].item()])
    assert got is not None and a.translate_loc_from_full_to_swa(got).min() > 0
    assert decode(a, [7], [got[-1].item()]) is not None  # continues the page, peer intact
    # A row continued mid-page from a position whose peer is gone: the SWA side
    # has nothing to continue (a caller contract break), and debug mode says so.
    a.free_swa(got)
    with pytest.raises(AssertionError, match="last_loc"):
        decode(a, [8], [got[-1].item() + 1])


def _forbid_sync_ops():
    def boom(*a, **k):
        raise AssertionError("a debug-only op ran with debug mode off")

    return [mock.patch.object(torch, name, boom) for name in ("unique", "isin", "sort")]


def test_debug_off_pays_nothing_on_segment_and_page_id_frees():
    a = hybrid(size=32, size_swa=32, page_size=4)
    b = paged(size=32)
    full = extend(a, [0], [10], [-1])
    y = b.alloc(16)
    patches = _forbid_sync_ops()
    for p in patches:
        p.start()
    try:
        a.free_swa_segment(full[:8], start_pos=0)
        b.free_segment(y[4:12], start_pos=4)
        b.free_page_ids(T(1))
        b.free_group_begin()
        b.free_page_ids(T(4))
        b.free_group_end()
    finally:
        for p in patches:
            p.stop()
    assert free_set(b) == [1, 2, 3, 4, 5, 6, 7, 8]


# ------------------------------------------------------------ free_swa_segment


def oracle(a, full, lo, hi):
    """SWA pages to release and full slots to unpair, from the mapping before the call."""
    ps, m = a.page_size, a.full_to_swa_index_mapping.tolist()
    pages = sorted({s // ps for s in full[lo:hi]})
    slots = [p * ps + i for p in pages for i in range(ps)]
    return sorted({m[s] // ps for s in slots if m[s] > 0}), slots


@pytest.mark.parametrize("ps", [1, 2, 4])
@pytest.mark.parametrize("need_sort", [False, True])
def test_free_swa_segment_sweep_against_an_oracle_and_free_swa(ps, need_sort):
    for n in (ps, ps + 1, 3 * ps - 1):
        for lo in range(0, n, ps):
            for hi in range(lo + 1, n + 1):
                seg, old = hybrid(32, 32, ps, need_sort), hybrid(32, 32, ps, need_sort)
                rows = []
                for a in (seg, old):
                    a.alloc(4 * ps) if ps == 1 else extend(a, [0], [4], [-1])  # skew the pools
                    rows.append(a.alloc(n) if ps == 1 else extend(a, [0], [n], [-1]))
                row = rows[0].tolist()
                want_pages, unpaired = oracle(seg, row, lo, hi)
                before = set(free_set(seg.swa_attn_allocator))
                seg.free_swa_segment(rows[0][lo:hi], start_pos=lo)
                old.free_swa(rows[1][lo:hi])
                label = (ps, need_sort, n, lo, hi)
                assert sorted(set(free_set(seg.swa_attn_allocator)) - before) == want_pages, label
                assert all(seg.full_to_swa_index_mapping[s].item() == 0 for s in unpaired), label
                assert free_set(seg.swa_attn_allocator) == free_set(old.swa_attn_allocator), label
                assert torch.equal(seg.full_to_swa_index_mapping, old.full_to_swa_index_mapping), label
                assert seg.swa_available_size() == old.swa_available_size(), label


def test_free_swa_segment_unaligned_start_is_refused_before_anything_changes():
    a = hybrid(size=32, size_swa=32, page_size=4)
    full = extend(a, [0], [8], [-1])
    before = (free_set(a.swa_attn_allocator), a.full_to_swa_index_mapping.tolist())
    for exc in (AssertionError, ValueError):
        with pytest.raises(exc, match="start_pos=1 is not aligned"):
            a.free_swa_segment(full[1:], start_pos=1)
    assert (free_set(a.swa_attn_allocator), a.full_to_swa_index_mapping.tolist()) == before


@pytest.mark.parametrize("ps", [1, 4])
def test_free_swa_segment_of_a_dead_representative_trips_peer_mapped(ps):
    a = hybrid(size=32, size_swa=32, page_size=ps)
    full = a.alloc(8) if ps == 1 else extend(a, [0], [8], [-1])
    a.free_swa_segment(full, start_pos=0)
    before = (free_set(a.swa_attn_allocator), a.full_to_swa_index_mapping.tolist())
    with invariants.override_level("warn"):
        with pytest.raises(InvariantViolation, match="swa.peer_mapped"):
            a.free_swa_segment(full, start_pos=0)
    assert (free_set(a.swa_attn_allocator), a.full_to_swa_index_mapping.tolist()) == before


def test_debug_catches_a_dead_representative_at_level_off():
    a = hybrid(size=32, size_swa=32, page_size=4)
    a.debug_mode = True
    full = extend(a, [0], [8], [-1])
    a.free_swa_segment(full, start_pos=0)
    before = (free_set(a.swa_attn_allocator), a.full_to_swa_index_mapping.tolist())
    with invariants.override_level("off"):
        with pytest.raises(AssertionError, match="representative"):
            a.free_swa_segment(full, start_pos=0)
    assert (free_set(a.swa_attn_allocator), a.full_to_swa_index_mapping.tolist()) == before


def test_debug_catches_a_page_paired_out_of_step():
    # A load-back that re-pairs a full page from inside an SWA page straddles two.
    a = hybrid(size=32, size_swa=32, page_size=4)
    a.debug_mode = True
    full = extend(a, [0], [4], [-1])
    a.free_swa(full)
    swa = a.swa_attn_allocator.alloc(8)
    a.set_full_to_swa_mapping(full, swa[2:6])
    with pytest.raises(AssertionError, match="not paired in step"):
        a.free_swa_segment(full, start_pos=0)


def test_free_swa_segment_in_a_group_resolves_peers_at_enqueue():
    a = hybrid(size=32, size_swa=32, page_size=4)
    full = extend(a, [0], [8], [-1])
    peers = a.translate_loc_from_full_to_swa(full).tolist()
    swa_before = a.swa_available_size()
    a.free_group_begin()
    row = full.clone()
    a.free_swa_segment(row[:4], start_pos=0)
    row.fill_(0)  # the scheduler reuses its row
    # A load-back inside the group pairs the evicted page anew.
    fresh = a.swa_attn_allocator.alloc(4)
    a.set_full_to_swa_mapping(full[:4], fresh)
    assert a.swa_available_size() == swa_before - 4
    a.free_group_end()
    assert a.swa_available_size() == swa_before
    assert peers[0] // 4 in free_set(a.swa_attn_allocator)
    assert a.translate_loc_from_full_to_swa(full[:4]).tolist() == fresh.tolist()


def test_free_swa_segment_is_a_no_op_in_ring_mode():
    a = make_allocator({"kind": "hybrid", "size": 32, "page_size": 4, "ring_size": 4, "req_slots": 2})
    full = extend(a, [0], [6], [-1])
    before = (a.swa_available_size(), a.full_to_swa_index_mapping.tolist())
    a.free_swa_segment(full, start_pos=0)
    assert (a.swa_available_size(), a.full_to_swa_index_mapping.tolist()) == before


def test_pure_swa_free_swa_segment_frees_the_slots_and_keeps_the_identity():
    a = make_allocator({"kind": "pure_swa", "size": 16, "page_size": 1})
    ident = a.full_to_swa_index_mapping.clone()
    x = a.alloc(4)
    a.free_swa_segment(x, start_pos=0)
    assert a.available_size() == 16 and torch.equal(a.full_to_swa_index_mapping, ident)
    assert set(x.tolist()) <= set(a.swa_attn_allocator.free_pages.tolist())


def test_free_segment_keeps_the_seeds_swa_half_on_unpaired_positions():
    # free_segment stays the seed's (free_swa then the full side): a row whose
    # first page lost its peers to an eviction still frees without a guard.
    a = hybrid(size=32, size_swa=32, page_size=4)
    full = tail(a, 0, 10, -1, 3)
    with invariants.override_level("strict"):
        a.free_segment(full, start_pos=0)
    assert a.full_available_size() == 32 and a.swa_available_size() == 32


# ------------------------------------------------------------ attributes


@pytest.mark.parametrize("make", [lambda ns: token(8, ns), lambda ns: paged(32, 4, ns)], ids=["token", "paged"])
@pytest.mark.parametrize("need_sort", [False, True])
def test_free_pages_and_release_pages_say_what_sglangs_would(make, need_sort):
    a = make(need_sort)
    x = a.alloc(a.available_size())
    a.free(x[: len(x) // 2])
    n = a.available_size() // a.page_size
    if need_sort:
        assert len(a.free_pages) == 0 and len(a.release_pages) == n
    else:
        assert len(a.free_pages) == n and len(a.release_pages) == 0
    if a.page_size > 1:
        assert a.num_staged_pages == (n if need_sort else 0)
        assert sum(t.numel() for t in a.staged_pages) == a.num_staged_pages


@pytest.mark.parametrize("need_sort", [False, True])
@pytest.mark.parametrize("first", ["free_pages", "release_pages"])
def test_census_reading_counts_each_free_page_once_in_either_order(need_sort, first):
    a = paged(32, 4, need_sort)
    x = a.alloc(20)
    a.free(x[:4])
    a.free(x[12:16])
    getattr(a, first)  # whichever a caller looks at first
    got = observe.free_pages(a)
    assert sorted(got) == [1, 4, 6, 7, 8] and len(got) == 5


def test_reading_free_pages_never_changes_which_page_goes_out_next():
    seqs = []
    for look in (False, True):
        a = paged(32, 4)
        x = a.alloc(16)
        a.free(x[4:8])
        if look:
            a.free_pages
        a.free(x[:4])
        if look:
            a.release_pages
        seqs.append(a.alloc(24).tolist())
    assert seqs[0] == seqs[1]


def test_is_not_in_free_group_on_the_hybrid():
    a = hybrid()
    assert a.is_not_in_free_group
    a.free_group_begin()
    assert not a.is_not_in_free_group and a.free_pages is None and a.release_pages is None
    a.free_group_end()
    assert a.is_not_in_free_group


def test_free_full_segments_and_transfer_translation():
    a = hybrid(size=32, size_swa=32, page_size=4)
    full = extend(a, [0], [10], [-1])
    a.free_swa(full)
    with pytest.raises(ValueError, match="not after"):
        a.free_full_segments([(full[4:8], 4), (full[4:6], 4)])
    assert a.full_available_size() == 20  # a bad list frees nothing
    a.free_full_segments([(full[:4], 0), (full[4:10], 4)])
    assert a.full_available_size() == 32
    p = paged()
    x = p.alloc(8)
    p.free_full_segments([(x[:4], 0), (x[4:], 4)])
    assert p.available_size() == 32 and p.translate_kv_indices_for_transfer(x) is x
    b = hybrid(size=16, size_swa=16, page_size=1)
    y = b.alloc(3)
    assert b.translate_swa_indices_for_transfer(y).tolist() == b.full_to_swa_index_mapping[y].tolist()
