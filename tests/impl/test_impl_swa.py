"""The hybrid SWA allocator, method by method."""

import types

import pytest
import torch
from impl_testlib import T, decode, extend, free_set, hybrid, snapshot, tail

from impl import invariants as inv
from impl.invariants import InvariantViolation


def cfg(full, swa):
    return types.SimpleNamespace(full_max_total_num_tokens=full, swa_max_total_num_tokens=swa)


def peers(a, full):
    return a.full_to_swa_index_mapping[full].tolist()


# ---------------------------------------------------------------- construction


def test_mapping_layout_sizes_and_registration():
    a = hybrid(size=32, size_swa=16, page_size=4)
    m = a.full_to_swa_index_mapping
    assert m.dtype == torch.int64 and len(m) == 32 + 4 + 1
    assert m[-1].item() == -1 and int(m[:-1].abs().sum()) == 0
    assert a.get_kvcache().full_to_swa_index_mapping is m
    assert (a.size, a.size_full, a.size_swa) == (16, 32, 16)
    assert (a.full_available_size(), a.swa_available_size(), a.available_size()) == (32, 16, 16)
    assert a.translate_loc_from_full_to_swa(T(-1)).tolist() == [-1]
    assert a.swa_req_ring is False and a.swa_ring_cost_tokens == 0
    assert "swa-available-size: 16" in a.debug_print()


# ---------------------------------------------------------------- page_size 1


def test_alloc_pairs_full_and_swa():
    a = hybrid(size=8, size_swa=6, page_size=1)
    full = a.alloc(3)
    assert full.tolist() == [1, 2, 3]
    assert peers(a, full) == [1, 2, 3]
    assert a.available_size() == 3


def test_alloc_short_on_either_side_returns_none_unchanged():
    a = hybrid(size=8, size_swa=4, page_size=1)
    a.alloc(2)
    before = snapshot(a)
    assert a.alloc(3) is None  # full has 6, SWA 2
    assert snapshot(a) == before


def test_slot_zero_never_handed_out_on_either_side():
    a = hybrid(size=4, size_swa=4, page_size=1)
    full = a.alloc(4)
    assert 0 not in full.tolist() and 0 not in peers(a, full)
    a.free(full)
    full = a.alloc(4)
    assert 0 not in full.tolist() and 0 not in peers(a, full)


def test_paged_calls_on_page_size_1_refused_unchanged():
    a = hybrid(size=8, size_swa=8, page_size=1)
    a.alloc(2)
    before = snapshot(a)
    with pytest.raises(ValueError, match="page_size=1"):
        extend(a, [0], [3], [-1])
    with pytest.raises(ValueError, match="page_size=1"):
        tail(a, 0, 3, -1, 1)
    with pytest.raises(ValueError, match="page_size=1"):
        decode(a, [3], [2])
    assert snapshot(a) == before


def test_alloc_on_paged_hybrid_refused_unchanged():
    a = hybrid(page_size=4)
    before = snapshot(a)
    with pytest.raises(ValueError, match="page_size=4"):
        a.alloc(4)
    assert snapshot(a) == before


# ---------------------------------------------------------------- paged extend / decode


def test_extend_pairs_both_rows_and_continues_the_swa_row():
    a = hybrid(size=64, size_swa=64, page_size=4)
    a.swa_attn_allocator.alloc(8)  # the SWA side starts two pages later
    full = extend(a, [0], [6], [-1])
    assert full.tolist() == [4, 5, 6, 7, 8, 9]
    assert peers(a, full) == [12, 13, 14, 15, 16, 17]
    # Continue mid-page: the SWA row continues from the translated last_loc.
    more = extend(a, [6], [10], [9])
    assert more.tolist() == [10, 11, 12, 13]
    assert peers(a, more) == [18, 19, 20, 21]


def test_extend_short_on_swa_returns_none_unchanged():
    a = hybrid(size=64, size_swa=8, page_size=4)
    extend(a, [0], [4], [-1])
    before = snapshot(a)
    assert extend(a, [0], [8], [-1]) is None
    assert snapshot(a) == before


def test_decode_pairs_in_page_and_on_new_page():
    a = hybrid(size=64, size_swa=64, page_size=4)
    a.swa_attn_allocator.alloc(4)
    row = extend(a, [0, 0], [4, 5], [-1, -1])  # full pages 1 | 2, 3
    assert row.tolist() == [4, 5, 6, 7, 8, 9, 10, 11, 12]
    got = decode(a, [5, 6], [7, 12])
    assert got.tolist() == [16, 13]
    assert peers(a, got) == [20, 17]


def test_decode_short_on_swa_returns_none_with_nothing_taken():
    a = hybrid(size=64, size_swa=8, page_size=4)
    extend(a, [0], [8], [-1])  # the SWA pool is now empty
    before = snapshot(a)
    assert decode(a, [9], [11]) is None
    assert snapshot(a) == before


# ---------------------------------------------------------------- free


def test_free_releases_both_sides_and_unpairs():
    a = hybrid(size=32, size_swa=32, page_size=4)
    row = extend(a, [0], [6], [-1])
    a.free(row)
    assert a.available_size() == 32
    assert int(a.full_to_swa_index_mapping[:-1].abs().sum()) == 0


@pytest.mark.parametrize("page_size", [1, 4])
def test_free_releases_swa_before_full(page_size):
    # At strict the full side's guard would fire if the full side went first,
    # because the peers would still be mapped.
    a = hybrid(size=32, size_swa=32, page_size=page_size)
    row = a.alloc(6) if page_size == 1 else extend(a, [0], [6], [-1])
    with inv.override_level("strict"):
        a.free(row)
    assert a.available_size() == 32


def test_free_swa_paged_clears_whole_pages_and_keeps_full():
    a = hybrid(size=32, size_swa=32, page_size=4)
    row = extend(a, [0], [10], [-1])  # pages 1, 2, 3
    a.free_swa(row[:5])  # positions 0..4 touch pages 1 and 2
    assert peers(a, row) == [0] * 8 + [12, 13]
    assert a.swa_available_size() == 32 - 4
    assert a.full_available_size() == 32 - 12
    with inv.override_level("strict"):
        a.free_full(row[:8])  # peers released: the guard is quiet
    a.free(row[8:])
    assert a.available_size() == 32


def test_release_swa_skips_unpaired_slots_of_a_page():
    # A load-back may pair a page-aligned full chunk with an SWA chunk that
    # starts mid-page, leaving unpaired slots on the full page.
    a = hybrid(size=32, size_swa=32, page_size=4)
    full = a.full_attn_allocator.alloc(4)  # page 1
    swa = a.swa_attn_allocator.alloc(8)  # pages 1, 2
    a.set_full_to_swa_mapping(full[1:], swa[5:8])
    a.free(full)
    assert free_set(a.swa_attn_allocator) == [2, 3, 4, 5, 6, 7, 8]
    assert 0 not in free_set(a.swa_attn_allocator)


def test_peer_mapped_guard_fires_at_warn_and_strict_silent_at_off():
    for level in ("warn", "strict"):
        a = hybrid(size=8, size_swa=8, page_size=1)
        full = a.alloc(3)
        a.free_swa(full[:1])
        before = snapshot(a)
        with inv.override_level(level), pytest.raises(InvariantViolation) as err:
            a.free(full[:2])
        assert err.value.invariant == "swa.peer_mapped"
        assert snapshot(a) == before
    a = hybrid(size=8, size_swa=8, page_size=1)
    full = a.alloc(3)
    a.free_swa(full[:1])
    with inv.override_level("off"):
        a.free_swa(full[:1])
    assert inv.hit_counts()["swa.peer_mapped"] == 0


def test_peer_released_guard_strict_warn_off():
    a = hybrid(size=16, size_swa=16, page_size=1)
    full = a.alloc(4)
    before = snapshot(a)
    with inv.override_level("strict"), pytest.raises(InvariantViolation) as err:
        a.free_full(full[:2])
    assert err.value.invariant == "swa.peer_released"
    assert snapshot(a) == before

    with inv.override_level("warn"):
        a.free_full(full[:2])  # counted, and the call goes through
    assert inv.hit_counts()["swa.peer_released"] == 2
    assert a.invariant_hits()["swa.peer_released"] == 2
    assert a.full_available_size() == 14

    with inv.override_level("off"):
        a.free_full(full[2:3])
    assert inv.hit_counts()["swa.peer_released"] == 2


def test_peer_released_guard_on_free_full_segment():
    a = hybrid(size=32, size_swa=32, page_size=4)
    row = extend(a, [0], [8], [-1])
    before = snapshot(a)
    with inv.override_level("strict"), pytest.raises(InvariantViolation):
        a.free_full_segment(row[4:], start_pos=4)
    assert snapshot(a) == before
    with inv.override_level("warn"):
        a.free_full_segment(row[4:], start_pos=4)
    assert inv.hit_counts()["swa.peer_released"] == 4
    a.free_swa(row[:4])
    with inv.override_level("strict"):
        a.free_full_segment(row[:4], start_pos=0)


# ---------------------------------------------------------------- free_segment


def test_free_segment_releases_tail_pages_on_both_sides():
    a = hybrid(size=32, size_swa=32, page_size=4)
    row = extend(a, [0], [10], [-1])
    a.free_segment(row[4:], start_pos=4)  # pages 2, 3; the end is mid-page
    assert a.full_available_size() == 32 - 4
    assert a.swa_available_size() == 32 - 4
    assert peers(a, row[:4]) == [4, 5, 6, 7]


def test_free_segment_unaligned_refused_before_touching_the_mapping():
    a = hybrid(size=32, size_swa=32, page_size=4)
    row = extend(a, [0], [10], [-1])
    before = snapshot(a)
    with pytest.raises(ValueError, match=r"start_pos=5.*page_size=4"):
        a.free_segment(row[5:], start_pos=5)
    with pytest.raises(ValueError, match="start_pos=6"):
        a.free_full_segment(row[6:], start_pos=6)
    assert snapshot(a) == before


def test_free_segments_on_hybrid():
    a = hybrid(size=64, size_swa=64, page_size=4)
    row = extend(a, [0], [16], [-1])
    before = snapshot(a)
    with pytest.raises(ValueError):
        a.free_segments([(row[8:12], 8), (row[0:4], 0)])
    assert snapshot(a) == before
    a.free_segments([(row[0:4], 0), (row[8:16], 8)])
    assert peers(a, row[4:8]) == [8, 9, 10, 11]
    assert a.available_size() == 64 - 4


# ---------------------------------------------------------------- free groups


def test_group_defers_both_sides_until_end():
    a = hybrid(size=32, size_swa=32, page_size=4)
    row = extend(a, [0], [8], [-1])
    a.free_group_begin()
    a.free(row)
    assert (a.full_available_size(), a.swa_available_size()) == (24, 24)
    # The mapping is cleared at once: the slots are no longer paired.
    assert peers(a, row) == [0] * 8
    a.free_group_end()
    assert a.available_size() == 32 and a.free_group is None


def test_group_fixes_swa_ownership_at_enqueue():
    a = hybrid(size=32, size_swa=32, page_size=1)
    full = a.alloc(2)
    old = peers(a, full)
    a.free_group_begin()
    a.free_swa(full)  # window eviction, held
    fresh = a.swa_attn_allocator.alloc(2)  # a load-back re-pairs the range
    a.set_full_to_swa_mapping(full, fresh)
    a.free_group_end()
    # The held release is the old peers; the new pairing survives.
    assert peers(a, full) == fresh.tolist()
    assert set(old) <= set(free_set(a.swa_attn_allocator))
    assert not set(fresh.tolist()) & set(free_set(a.swa_attn_allocator))


def test_group_holds_a_copy_of_the_callers_row():
    a = hybrid(size=32, size_swa=32, page_size=4)
    row = extend(a, [0], [8], [-1])
    a.free_group_begin()
    a.free(row)
    row.fill_(0)  # the caller's token row is reused before the group ends
    a.free_group_end()
    assert free_set(a.full_attn_allocator) == list(range(1, 9))
    assert free_set(a.swa_attn_allocator) == list(range(1, 9))


def test_group_nesting_refused_state_unchanged():
    a = hybrid(size=32, size_swa=32, page_size=4)
    row = extend(a, [0], [8], [-1])
    a.free_group_begin()
    a.free(row[:4])
    before = snapshot(a)
    with pytest.raises(RuntimeError, match="free_group_end first"):
        a.free_group_begin()
    assert snapshot(a) == before
    a.free_group_end()
    assert a.available_size() == 28


def test_group_guard_is_judged_at_enqueue():
    a = hybrid(size=16, size_swa=16, page_size=1)
    full = a.alloc(2)
    a.free_group_begin()
    with inv.override_level("strict"):
        a.free(full)  # peers released first, so free_full's check passes
        # A later re-pair of the same slot does not reach back to that call.
        a.set_full_to_swa_mapping(full, a.swa_attn_allocator.alloc(2))
        a.free_group_end()
    assert a.full_available_size() == 16


# ---------------------------------------------------------------- SWA tail


def test_swa_tail_pairs_only_the_last_tokens():
    a = hybrid(size=64, size_swa=64, page_size=4)
    full = tail(a, 0, 10, -1, 3)
    assert full.tolist() == list(range(4, 14))
    # Positions 7..9 keep their in-page offsets (3, 0, 1) on the SWA side, so the
    # tail spans two SWA pages (FINDINGS.md: a packed tail lets decode overrun).
    assert peers(a, full) == [0] * 7 + [7, 8, 9]
    assert a.swa_available_size() == 64 - 8
    assert a.full_available_size() == 64 - 12


def test_swa_tail_zero_and_whole():
    a = hybrid(size=64, size_swa=64, page_size=4)
    full = tail(a, 0, 6, -1, 0)
    assert peers(a, full) == [0] * 6 and a.swa_available_size() == 64
    full2 = tail(a, 0, 5, -1, 5)
    assert peers(a, full2) == [4, 5, 6, 7, 8]


@pytest.mark.parametrize("tail_len", [0, 2])
def test_swa_tail_clears_stale_peers_on_recycled_pages(tail_len):
    a = hybrid(size=16, size_swa=16, page_size=4)
    # Leave stale peers on the page the next extend will recycle (page 1).
    a.full_to_swa_index_mapping[4:8] = torch.tensor([9, 10, 11, 12])
    full = tail(a, 0, 4, -1, tail_len)
    assert full.tolist() == [4, 5, 6, 7]
    # The tail sits at its full offsets on a fresh SWA page (page 1: slots 4..7).
    want = [0] * (4 - tail_len) + list(range(8 - tail_len, 8))
    assert peers(a, full) == want


def test_swa_tail_short_on_swa_returns_none_unchanged():
    a = hybrid(size=64, size_swa=4, page_size=4)
    before = snapshot(a)
    assert tail(a, 0, 12, -1, 5) is None  # the tail needs two SWA pages
    assert snapshot(a) == before
    assert tail(a, 0, 12, -1, 4) is not None


def test_swa_tail_contract_breaks_refused_unchanged():
    a = hybrid(size=64, size_swa=64, page_size=4)
    before = snapshot(a)
    pre, sl = T(0, 0), T(4, 4)
    with pytest.raises(ValueError, match="batch of 2"):
        a.alloc_extend_swa_tail(pre, pre, sl, sl, T(-1, -1), 8, 2)
    with pytest.raises(ValueError, match="swa_tail_len=5"):
        tail(a, 0, 4, -1, 5)
    with pytest.raises(ValueError, match="swa_tail_len=-1"):
        tail(a, 0, 4, -1, -1)
    assert snapshot(a) == before


# ---------------------------------------------------------------- clear / resize / misc


def test_clear_keeps_the_sentinel_and_closes_the_group():
    a = hybrid(size=32, size_swa=32, page_size=4)
    extend(a, [0], [9], [-1])
    a.free_group_begin()
    a.clear()
    m = a.full_to_swa_index_mapping
    assert m[-1].item() == -1 and int(m[:-1].abs().sum()) == 0
    assert a.free_group is None and a.swa_free_group == []
    assert a.available_size() == 32
    a.free_group_begin()  # a new group opens: the old one is gone
    a.free_group_end()


def test_resize_shrinks_and_refuses_growth_unchanged():
    a = hybrid(size=32, size_swa=16, page_size=4)
    extend(a, [0], [5], [-1])
    a.resize(cfg(24, 8))
    assert (a.size_full, a.size_swa, a.size) == (24, 8, 8)
    assert free_set(a.full_attn_allocator) == [1, 2, 3, 4, 5, 6]
    assert free_set(a.swa_attn_allocator) == [1, 2]
    assert a.full_to_swa_index_mapping[-1].item() == -1
    extend(a, [0], [3], [-1])
    before = snapshot(a)
    with pytest.raises(ValueError, match="full_max_total_num_tokens=40"):
        a.resize(cfg(40, 8))
    with pytest.raises(ValueError, match="swa_max_total_num_tokens=17"):
        a.resize(cfg(24, 17))
    assert snapshot(a) == before and (a.size_full, a.size_swa) == (24, 8)
    a.resize(cfg(32, 16))  # back up to the built size is fine
    assert a.available_size() == 16


def test_need_sort_on_hybrid_stages_and_merges_sorted():
    a = hybrid(size=16, size_swa=16, page_size=1, need_sort=True)
    full = a.alloc(16)
    a.free(full[10:12])
    a.free(full[2:4])
    assert a.available_size() == 4
    assert len(a.full_attn_allocator.free_pages) == 0
    got = a.alloc(4)
    assert got.tolist() == [3, 4, 11, 12]
    a.free(got[:2])
    a.merge_and_sort_free()
    assert a.full_attn_allocator.free_pages.tolist() == [3, 4]


def test_expand_to_full_pages_keeps_duplicates_and_checks_in_debug():
    a = hybrid(size=32, size_swa=32, page_size=4)
    got = a._expand_to_full_pages(T(5, 6, 13))
    assert got.tolist() == [4, 5, 6, 7, 4, 5, 6, 7, 12, 13, 14, 15]
    a.swa_attn_allocator.debug_mode = True
    assert len(a._expand_to_full_pages(T(9))) == 4


def test_cpu_copy_round_trip_through_the_mapping():
    a = hybrid(size=16, size_swa=16, page_size=1)
    kv = a.get_kvcache()
    full = a.alloc(3)
    kv.full_kv_pool.kv_buffer[full] = T(11, 12, 13)
    kv.swa_kv_pool.kv_buffer[a.translate_loc_from_full_to_swa(full)] = T(21, 22, 23)
    copy = a.get_cpu_copy(full)
    kv.full_kv_pool.kv_buffer.zero_()
    kv.swa_kv_pool.kv_buffer.zero_()
    a.load_cpu_copy(copy, full)
    assert kv.full_kv_pool.kv_buffer[full].tolist() == [11, 12, 13]
    assert kv.swa_kv_pool.kv_buffer[peers(a, full)].tolist() == [21, 22, 23]
    assert len(kv.full_kv_pool.kv_buffer) == 16 + 1


def test_empty_index_calls_are_no_ops():
    a = hybrid(size=16, size_swa=16, page_size=4)
    before = snapshot(a)
    empty = T()
    a.free(empty)
    a.free_swa(empty)
    a.free_full(empty)
    a.free_segment(empty, start_pos=0)
    a.free_full_segment(empty, start_pos=4)
    a.set_full_to_swa_mapping(empty, empty)
    a.clear_full_to_swa_mapping(empty)
    assert snapshot(a) == before


def test_malformed_batches_refused_unchanged():
    a = hybrid(size=64, size_swa=64, page_size=4)
    extend(a, [0], [5], [-1])
    before = snapshot(a)
    pre, sl = T(0, 0), T(4, 4)
    with pytest.raises(ValueError, match="differ in length"):
        a.alloc_extend(pre, pre, T(4), T(4), T(-1, -1), 8)
    with pytest.raises(ValueError, match="extend_num_tokens=7"):
        a.alloc_extend(pre, pre, sl, sl, T(-1, -1), 7)
    with pytest.raises(ValueError, match="below its prefix_len"):
        a.alloc_extend(T(5), T(5), T(4), T(4), T(8), -1)
    with pytest.raises(ValueError, match="differ in length"):
        a.alloc_decode(T(6, 7), T(6, 7), T(8))
    with pytest.raises(ValueError, match=">= 1"):
        a.alloc_decode(T(0), T(0), T(-1))
    assert snapshot(a) == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_slot_for_slot():
    from impl.factory import make_allocator

    def run(device):
        a = make_allocator(dict(kind="hybrid", size=256, size_swa=128, page_size=4, device=device))
        dev = torch.device(device)
        pre, sl = T(0, 0).to(dev), T(9, 12).to(dev)
        row = a.alloc_extend(pre, pre.cpu(), sl, sl.cpu(), T(-1, -1).to(dev), 21)
        seq = T(10, 13)
        dec = a.alloc_decode(seq.to(dev), seq, torch.stack([row[8], row[-1]]))
        a.free_swa(row[:4])
        a.free_full(row[:4])
        a.free(torch.cat([row[4:], dec]))
        return row.tolist(), dec.tolist(), snapshot(a)

    assert run("cuda") == run("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_strict_guard_is_an_async_device_assert():
    import subprocess
    import sys
    import textwrap

    # A device assert poisons the CUDA context, so it runs in its own process.
    code = textwrap.dedent(
        """
        import torch
        from impl.factory import make_allocator
        a = make_allocator(dict(kind="hybrid", size=64, size_swa=64, page_size=1,
                                device="cuda", check_level="strict"))
        full = a.alloc(2)
        a.free_full(full)      # returns without a host sync
        print("returned", flush=True)
        torch.cuda.synchronize()
        """
    )
    root = __import__("os").path.dirname(__import__("impl").__path__[0])
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert "returned" in proc.stdout
    assert proc.returncode != 0
