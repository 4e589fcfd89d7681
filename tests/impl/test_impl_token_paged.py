"""Token (page_size 1) and paged allocators: free lists, layouts, staging, groups."""

import types

import pytest
import torch
from impl_testlib import T, free_set

from impl.paged import (
    PagedTokenToKVPoolAllocator,
    decode_layout,
    extend_layout,
    get_num_new_pages,
)
from impl.token import TokenToKVPoolAllocator


def token(size=8, need_sort=False):
    return TokenToKVPoolAllocator(size, torch.int64, "cpu", None, need_sort)


def paged(size=32, page_size=4, need_sort=False):
    return PagedTokenToKVPoolAllocator(size, page_size, torch.int64, "cpu", None, need_sort)


def p_extend(a, prefix, seq, last, **kw):
    pre, sl = T(*prefix), T(*seq)
    return a.alloc_extend(pre, pre.clone(), sl, sl.clone(), T(*last), int((sl - pre).sum()), **kw)


def p_decode(a, seq, last):
    sl = T(*seq)
    return a.alloc_decode(sl, sl.clone(), T(*last))


# ---------------------------------------------------------------- token allocator


def test_token_free_list_is_1_to_size_and_alloc_takes_its_front():
    a = token(8)
    assert a.page_size == 1 and a.debug_mode is False and a.need_sort is False
    assert free_set(a) == list(range(1, 9))
    assert a.available_size() == 8
    assert a.alloc(3).tolist() == [1, 2, 3]
    assert a.alloc(5).tolist() == [4, 5, 6, 7, 8]
    assert a.alloc(1) is None
    assert a.available_size() == 0


def test_token_alloc_short_returns_none_and_changes_nothing():
    a = token(4)
    a.alloc(2)
    before = free_set(a)
    assert a.alloc(3) is None
    assert free_set(a) == before and a.available_size() == 2


def test_token_slot_zero_is_never_handed_out():
    a = token(5)
    got = a.alloc(5)
    assert 0 not in got.tolist()
    a.free(got)
    assert 0 not in a.alloc(5).tolist()


def test_free_is_visible_where_sglang_keeps_it_and_available_counts_it():
    # need_sort=False: sglang frees straight into free_pages.
    a = token(6)
    x = a.alloc(4)
    a.free(x[:2])
    assert a.available_size() == 4
    assert a.free_pages.tolist() == [5, 6, 1, 2] and a.release_pages.tolist() == []
    assert a.alloc(3).tolist() == [5, 6, 1]
    # need_sort=True: freed slots wait in release_pages until an alloc runs short.
    a = token(6, need_sort=True)
    x = a.alloc(4)
    a.free(x[:2])
    assert a.available_size() == 4
    assert a.free_pages.tolist() == [5, 6] and a.release_pages.tolist() == [1, 2]
    assert a.alloc(3).tolist() == [1, 2, 5]


def test_free_keeps_a_private_copy():
    a = token(4)
    x = a.alloc(2)
    a.free(x)
    x.fill_(0)
    assert free_set(a) == [1, 2, 3, 4]


@pytest.mark.parametrize("need_sort", [False, True])
def test_need_sort_merges_sorted_when_short(need_sort):
    a = token(6, need_sort=need_sort)
    x = a.alloc(6)
    a.free(x[4:])  # 5, 6
    a.free(x[:2])  # 1, 2
    assert a.available_size() == 4
    got = a.alloc(4).tolist()
    assert got == ([1, 2, 5, 6] if need_sort else [5, 6, 1, 2])


def test_merge_and_sort_free_folds_staging_in_sorted():
    a = token(6)
    x = a.alloc(5)
    a.free(x[3:])
    a.free(x[:1])
    a.merge_and_sort_free()
    assert a.release_pages.numel() == 0
    assert a.free_pages.tolist() == [1, 4, 5, 6]


def test_token_resize_shrinks_and_refuses_growth():
    a = token(8)
    a.alloc(3)
    a.resize(types.SimpleNamespace(max_total_num_tokens=5))
    assert a.size == 5 and free_set(a) == [1, 2, 3, 4, 5]
    before = free_set(a)
    with pytest.raises(ValueError, match="max_total_num_tokens=9"):
        a.resize(types.SimpleNamespace(max_total_num_tokens=9))
    assert free_set(a) == before and a.size == 5


def test_clear_restores_everything_and_closes_group():
    a = token(4)
    a.alloc(3)
    a.free_group_begin()
    a.clear()
    assert a.free_group is None and free_set(a) == [1, 2, 3, 4]


# ---------------------------------------------------------------- free groups


def test_free_group_defers_and_holds_a_copy():
    a = token(6)
    x = a.alloc(4)
    a.free_group_begin()
    a.free(x[:2])
    a.free(x[2:])
    assert a.available_size() == 2
    x.fill_(0)  # the caller reuses its row before the group ends
    a.free_group_end()
    assert free_set(a) == [1, 2, 3, 4, 5, 6]
    assert a.free_group is None


def test_free_group_nesting_refused_state_unchanged():
    a = token(6)
    x = a.alloc(2)
    a.free_group_begin()
    a.free(x)
    with pytest.raises(RuntimeError, match="free_group_end first"):
        a.free_group_begin()
    assert len(a.free_group) == 1
    a.free_group_end()
    assert a.available_size() == 6


def test_free_full_defaults_to_free():
    a = token(4)
    a.free_full(a.alloc(2))
    assert a.available_size() == 4


# ---------------------------------------------------------------- paged: alloc


def test_paged_free_pages_and_page_zero():
    a = paged(32, 4)
    assert a.num_pages == 8
    assert free_set(a) == list(range(1, 9))
    got = a.alloc(32)
    assert got.tolist() == list(range(4, 36))
    assert a.alloc(4) is None


def test_paged_alloc_needs_whole_pages():
    a = paged(32, 4)
    with pytest.raises(ValueError, match="page_size=4"):
        a.alloc(6)
    assert a.available_size() == 32
    assert a.alloc(8).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]


def test_get_num_new_pages():
    assert get_num_new_pages(T(6, 9), 4, T(0, 3)) == 2 + 2
    assert get_num_new_pages(T(4, 8), 4, T(4, 5)) == 0 + 0
    assert get_num_new_pages(seq_lens=T(5, 6, 9), page_size=4, decode=True) == 1 + 0 + 1
    assert get_num_new_pages(T(3), 1, T(1)) == 2
    with pytest.raises(ValueError):
        get_num_new_pages(T(3), 4)


# ---------------------------------------------------------------- paged: extend layouts


def test_extend_from_zero_whole_pages_then_partial():
    a = paged(64, 4)
    # 10 tokens: two whole pages, then a partial third.
    assert p_extend(a, [0], [10], [-1]).tolist() == [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    assert a.available_size() == 64 - 12


def test_extend_continues_a_partial_page():
    a = paged(64, 4)
    first = p_extend(a, [0], [6], [-1])  # pages 1, 2; position 5 at slot 9
    assert first.tolist() == [4, 5, 6, 7, 8, 9]
    # prefix 6: positions 6, 7 continue page 2 at 10, 11; 8..12 on new pages 3, 4.
    got = p_extend(a, [6], [13], [9])
    assert got.tolist() == [10, 11, 12, 13, 14, 15, 16]


def test_extend_staying_inside_the_last_page_takes_no_page():
    a = paged(64, 4)
    p_extend(a, [0], [5], [-1])
    avail = a.available_size()
    assert p_extend(a, [5], [7], [8]).tolist() == [9, 10]
    assert a.available_size() == avail


def test_extend_several_requests_take_pages_in_request_order():
    a = paged(64, 4)
    a.alloc(4)  # page 1 gone: new pages start at 2
    got = p_extend(a, [0, 2, 4], [5, 7, 8], [-1, 41, 55])
    # req 0: pages 2, 3 -> 8..11, 12; req 1: continue 42, 43 then page 4 -> 16..18;
    # req 2: prefix on a boundary, page 5 -> 20..23.
    assert got.tolist() == [8, 9, 10, 11, 12, 42, 43, 16, 17, 18, 20, 21, 22, 23]


def test_extend_layout_matches_a_per_position_oracle():
    ps = 4
    prefix, seq = [0, 3, 8, 5, 1], [9, 12, 8, 6, 2]
    last = [-1, 102, 207, 304, 400]
    n_new = get_num_new_pages(T(*seq), ps, T(*prefix))
    pages = torch.arange(50, 50 + n_new)
    total = sum(seq) - sum(prefix)
    got = extend_layout(T(*prefix), T(*seq), T(*last), pages, ps, total).tolist()
    # Both ways the layout is computed: with the host lengths this small batch takes the run table.
    assert extend_layout(T(*prefix), T(*seq), T(*last), pages, ps, total, (T(*prefix), T(*seq))).tolist() == got
    want, nxt = [], 50
    for pre, s, ll in zip(prefix, seq, last):
        first_page = -(-pre // ps)
        for p in range(pre, s):
            if p < first_page * ps:
                want.append(ll + 1 + p - pre)
            else:
                want.append((nxt + p // ps - first_page) * ps + p % ps)
        nxt += -(-s // ps) - first_page
    assert got == want


def test_extend_short_returns_none_with_nothing_changed():
    a = paged(16, 4)
    a.alloc(8)
    before = (free_set(a), a.available_size())
    assert p_extend(a, [0], [9], [-1]) is None
    assert (free_set(a), a.available_size()) == before


def test_extend_checks_its_token_count_before_taking_pages():
    a = paged(32, 4)
    pre, sl = T(0), T(5)
    with pytest.raises(ValueError, match="extend_num_tokens=4"):
        a.alloc_extend(pre, pre, sl, sl, T(-1), 4)
    assert a.available_size() == 32


# ---------------------------------------------------------------- paged: decode


def test_decode_in_page_and_onto_new_page():
    a = paged(64, 4)
    p_extend(a, [0, 0], [4, 6], [-1, -1])  # req0 pages 1; req1 pages 2, 3 (last at 13)
    # req0 seq 5 opens a new page; req1 seq 7 stays (slot 14).
    got = p_decode(a, [5, 7], [7, 13])
    assert got.tolist() == [16, 14]
    assert a.available_size() == 64 - 16


def test_decode_short_returns_none_with_nothing_changed():
    a = paged(8, 4)
    a.alloc(8)
    assert p_decode(a, [5], [7]) is None
    assert a.available_size() == 0
    # No new page needed: fine even with the pool empty.
    assert p_decode(a, [6], [8]).tolist() == [9]


def test_decode_layout_takes_pages_in_request_order():
    got = decode_layout(T(5, 9, 3, 13), T(7, 11, 1, 30), T(70, 80, 90), 4)
    assert got.tolist() == [280, 320, 2, 360]


# ---------------------------------------------------------------- paged: free


def test_paged_free_releases_each_touched_page_once():
    a = paged(32, 4)
    x = a.alloc(12)  # pages 1, 2, 3
    a.free(T(5, 6, 5, 13))  # pages 1 and 3, page 1 twice
    assert a.available_size() == 32 - 12 + 8
    assert free_set(a) == [1, 3, 4, 5, 6, 7, 8]
    del x


def test_free_segment_releases_pages_from_representatives():
    a = paged(32, 4)
    row = p_extend(a, [0], [10], [-1])  # pages 1, 2, 3 (3 partial)
    # Positions 4..9: page 2 whole, then page 3 whose end sits mid-page.
    a.free_segment(row[4:10], start_pos=4)
    assert free_set(a) == [2, 3, 4, 5, 6, 7, 8]


def test_free_segment_unaligned_start_refused_state_unchanged():
    a = paged(32, 4)
    row = a.alloc(8)
    with pytest.raises(ValueError, match=r"start_pos=2.*page_size=4"):
        a.free_segment(row[2:], start_pos=2)
    assert a.available_size() == 24


def test_free_segments_rules():
    a = paged(64, 4)
    row = p_extend(a, [0], [16], [-1])  # pages 1..4
    avail = a.available_size()
    # Page 2 in two segments (4..5, then 4..7 again): refused, nothing freed.
    with pytest.raises(ValueError, match="no two on one page"):
        a.free_segments([(row[0:4], 0), (row[4:6], 4), (row[4:8], 4)])
    # Overlap across pages (0..5 ends on page 2, next starts on page 2).
    with pytest.raises(ValueError, match="no two on one page"):
        a.free_segments([(row[0:6], 0), (row[4:8], 4)])
    # Descending: refused.
    with pytest.raises(ValueError):
        a.free_segments([(row[8:12], 8), (row[0:4], 0)])
    # An unaligned start anywhere in the list: refused before the first frees.
    with pytest.raises(ValueError, match="start_pos=10"):
        a.free_segments([(row[0:4], 0), (row[10:12], 10)])
    assert a.available_size() == avail
    # Ascending, one page each, a gap and a mid-page end: fine.
    a.free_segments([(row[0:4], 0), (row[8:11], 8)])
    assert free_set(a) == [1, 3] + list(range(5, 17))


def test_paged_group_holds_free_and_segment_until_end():
    a = paged(32, 4)
    row = p_extend(a, [0], [12], [-1])
    a.free_group_begin()
    a.free(row[:4])
    a.free_segment(row[4:12], start_pos=4)
    assert a.available_size() == 20
    row.fill_(0)
    a.free_group_end()
    assert free_set(a) == list(range(1, 9))


def test_paged_need_sort_reuse_order():
    a = paged(32, 4, need_sort=True)
    x = a.alloc(32)
    a.free(x[24:])  # page 7, 8
    a.free(x[:4])  # page 1
    assert a.alloc(12).tolist() == [4, 5, 6, 7, 28, 29, 30, 31, 32, 33, 34, 35]


def test_paged_resize():
    a = paged(32, 4)
    a.resize(types.SimpleNamespace(max_total_num_tokens=17))
    assert a.num_pages == 4 and free_set(a) == [1, 2, 3, 4]
    with pytest.raises(ValueError):
        a.resize(types.SimpleNamespace(max_total_num_tokens=33))
    assert a.num_pages == 4
