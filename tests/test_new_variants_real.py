"""Each scheduler-workload variant of fuzz/variants.py is a real fault: the same calls,
made by hand as a scheduler makes them, go right on the bundled impl and wrong on the
variant (a slot handed out twice, a page lost, the KV of another request, ...).

No harness here: these scenarios show what the lockstep machine must be able to reach.
"""

from __future__ import annotations

import pytest
import torch

from fuzz.variants import EXPECTED, SCHEDULER_WORKLOAD, VARIANTS
from impl import make_allocator


def T(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def extend(a, reqs):
    """One prefill batch: reqs is [(prefix_len, seq_len, last_loc), ...] in batch order."""
    pre = T([r[0] for r in reqs])
    seq = T([r[1] for r in reqs])
    last = T([r[2] for r in reqs])
    return a.alloc_extend(pre, pre.clone(), seq, seq.clone(), last, int((seq - pre).sum()))


def decode(a, reqs):
    """One decode batch: reqs is [(seq_len including the new token, last_loc), ...]."""
    seq = T([r[0] for r in reqs])
    return a.alloc_decode(seq, seq.clone(), T([r[1] for r in reqs]))


def both(name: str, config: dict):
    """The bundled impl and the variant, built from the same configuration."""
    return make_allocator(dict(config)), VARIANTS[name](dict(config))


def test_every_scheduler_workload_variant_has_a_scenario_here():
    scenarios = {n[len("test_") :] for n in globals() if n.startswith("test_") and n[len("test_") :] in VARIANTS}
    assert sorted(SCHEDULER_WORKLOAD - scenarios) == []
    assert SCHEDULER_WORKLOAD <= set(EXPECTED)


# ---------------------------------------------------------------- (a) mixed prefill batches


def test_mixed_batch_pages_by_extend():
    results = []
    for a in both("mixed_batch_pages_by_extend", {"kind": "hybrid", "size": 64, "page_size": 4}):
        r0 = extend(a, [(0, 2, -1)])  # a request's first chunk: 2 tokens on one page
        # Its next chunk (from prefix 2, spilling onto a new page) batched with a new
        # request of two pages: 1 + 2 new pages.
        out = extend(a, [(2, 7, int(r0[1])), (0, 8, -1)])
        results.append(out.tolist())
    impl, variant = results
    assert impl[:2] == [r0[1].item() + 1, r0[1].item() + 2]
    assert len(set(impl)) == len(impl) == 13
    new_request = variant[5:]
    # The new request's two pages are one page, twice: each of its slots is handed out twice.
    assert len(set(new_request)) == 4 and len(new_request) == 8


def test_mixed_batch_continuations_first():
    results = []
    for a in both("mixed_batch_continuations_first", {"kind": "hybrid", "size": 64, "page_size": 4}):
        r0 = extend(a, [(0, 2, -1)])
        last = int(r0[1])
        # A new request first, then the continuation from an unaligned prefix.
        out = extend(a, [(0, 4, -1), (2, 7, last)])
        results.append((last, out.tolist()))
    (last, impl), (vlast, variant) = results
    assert impl[4:6] == [last + 1, last + 2] and len(set(impl)) == 9
    # The continuation does not continue its page, and repeats a slot within its row.
    assert variant[4:6] != [vlast + 1, vlast + 2]
    assert len(set(variant[4:])) < 5


def test_mixed_batch_continuations_first_is_right_when_continuations_come_first():
    impl, variant = both("mixed_batch_continuations_first", {"kind": "hybrid", "size": 64, "page_size": 4})
    for a in (impl, variant):
        r0 = extend(a, [(0, 2, -1)])
        out = extend(a, [(2, 7, int(r0[1])), (0, 4, -1)])
        a.result = out.tolist()
    assert impl.result == variant.result


# ---------------------------------------------------------------- (b) decode batches in any order


def test_decode_pages_sorted_order():
    results = []
    for a in both("decode_pages_sorted_order", {"kind": "hybrid", "size": 64, "page_size": 4}):
        x = extend(a, [(0, 4, -1)])  # page 1, full: its next token opens a page
        z = extend(a, [(0, 2, -1)])  # page 2, stays inside it
        y = extend(a, [(0, 4, -1)])  # page 3, full
        # Not sorted by last_loc: y (15) before x (7), z (9) between them.
        out = decode(a, [(5, int(y[-1])), (5, int(x[-1])), (3, int(z[-1]))])
        results.append(out.tolist())
    impl, variant = results
    assert impl[0] != impl[1] and impl[0] % 4 == 0 and impl[1] % 4 == 0
    assert variant[0] == variant[1]  # two requests given the same new page


def test_decode_pages_sorted_order_is_right_on_a_sorted_batch():
    impl, variant = both("decode_pages_sorted_order", {"kind": "hybrid", "size": 64, "page_size": 4})
    for a in (impl, variant):
        x, z, y = extend(a, [(0, 4, -1)]), extend(a, [(0, 2, -1)]), extend(a, [(0, 4, -1)])
        a.result = decode(a, [(5, int(x[-1])), (3, int(z[-1])), (5, int(y[-1]))]).tolist()
    assert impl.result == variant.result


# ---------------------------------------------------------------- (c) retract and resume


def _tag(a, slots, base):
    """Write a request's KV: tags into its full slots and into their SWA peers."""
    kv = a.get_kvcache()
    kv.full_kv_pool.kv_buffer[slots] = base + torch.arange(len(slots))
    kv.swa_kv_pool.kv_buffer[a.full_to_swa_index_mapping[slots]] = base + 50 + torch.arange(len(slots))


def _read(a, slots):
    kv = a.get_kvcache()
    return (
        kv.full_kv_pool.kv_buffer[slots].tolist(),
        kv.swa_kv_pool.kv_buffer[kv.translate_loc_from_full_to_swa(slots)].tolist(),
    )


def test_cpu_copy_deferred():
    results = []
    for a in both("cpu_copy_deferred", {"kind": "hybrid", "size": 8, "page_size": 4}):
        r = extend(a, [(0, 4, -1)])  # page 1 of 2
        _tag(a, r, 100)
        had = _read(a, r)
        copy = a.get_cpu_copy(r)  # retract: copy to the host, free the slots
        a.free(r)
        other = extend(a, [(0, 8, -1)])  # another request takes both pages, page 1 among them
        _tag(a, other, 900)
        a.free(other[:4])
        a.free(other[4:])
        back = extend(a, [(0, 4, -1)])  # resume: new slots (page 2), the copy loaded back
        a.load_cpu_copy(copy, back)
        results.append((had, _read(a, back), sorted({int(s) // 4 for s in other[4:]})))
    (impl_had, impl_now, _), (var_had, var_now, reused) = results
    assert impl_now == impl_had
    assert reused == [1]  # the other request wrote where the retracted one had been
    assert var_now != var_had and var_now[0] == [904, 905, 906, 907]


def test_load_copy_skips_swa():
    results = []
    for a in both("load_copy_skips_swa", {"kind": "hybrid", "size": 8, "page_size": 1}):
        r = a.alloc(3)
        _tag(a, r, 100)
        had = _read(a, r)
        copy = a.get_cpu_copy(r)
        a.free(r)
        a.get_kvcache().swa_kv_pool.kv_buffer.fill_(777)  # earlier owners' KV everywhere
        back = a.alloc(3)
        a.load_cpu_copy(copy, back)
        results.append((had, _read(a, back)))
    (impl_had, impl_now), (var_had, var_now) = results
    assert impl_now == impl_had
    assert var_now[0] == var_had[0] and var_now[1] == [777, 777, 777]


# ---------------------------------------------------------------- (d) cache-style frees


def test_free_dedups_adjacent_only():
    results = []
    for a in both("free_dedups_adjacent_only", {"kind": "hybrid", "size": 64, "size_swa": 128, "page_size": 4}):
        ra = extend(a, [(0, 4, -1)])
        rb = extend(a, [(0, 4, -1)])
        extend(a, [(0, 4, -1)])  # a third request stays live
        # One eviction over pieces of two requests, as a radix cache passes them.
        a.free(torch.cat([ra[:2], rb, ra[2:]]))
        pages = []
        while (r := extend(a, [(0, 4, -1)])) is not None:
            pages.append(int(r[0]) // 4)
        results.append(pages)
    impl, variant = results
    assert len(set(impl)) == len(impl) == 15
    assert len(set(variant)) < len(variant)  # a page handed to two requests


# ---------------------------------------------------------------- (e) scale


def test_free_list_narrowed():
    impl, variant = both("free_list_narrowed", {"kind": "hybrid", "size": 100_000, "page_size": 1})
    for a in (impl, variant):
        first = a.alloc(32_767)
        assert (first.min().item(), first.max().item()) == (1, 32_767)
    assert impl.alloc(2).tolist() == [32_768, 32_769]
    # The variant's free list wrapped past 32,767: its next ids are negative, and the
    # hybrid's mapping write (a scatter, which checks its indices) refuses them.
    assert variant.full_attn_allocator.alloc(2).tolist() == [-32_768, -32_767]
    with pytest.raises(RuntimeError, match="out of bounds"):
        variant.alloc(2)


# ---------------------------------------------------------------- (f) the hybrid's own entry points


def test_hybrid_merge_drops_staged():
    results = []
    for a in both("hybrid_merge_drops_staged", {"kind": "hybrid", "size": 64, "page_size": 4, "need_sort": True}):
        r = extend(a, [(0, 8, -1)])
        a.free(r)
        before = (a.full_available_size(), a.swa_available_size())
        a.merge_and_sort_free()
        results.append((before, (a.full_available_size(), a.swa_available_size())))
    impl, variant = results
    assert impl == ((64, 64), (64, 64))
    assert variant == ((64, 64), (56, 56))  # the two freed pages are gone from both pools


def test_hybrid_merge_drops_staged_sub_allocator_merge_is_right():
    impl, variant = both("hybrid_merge_drops_staged", {"kind": "hybrid", "size": 64, "page_size": 4, "need_sort": True})
    for a in (impl, variant):
        a.free(extend(a, [(0, 8, -1)]))
        a.full_attn_allocator.merge_and_sort_free()
        a.swa_attn_allocator.merge_and_sort_free()
        assert (a.full_available_size(), a.swa_available_size()) == (64, 64)


# ---------------------------------------------------------------- (g) result dtypes


def test_extend_int32_no_new_page():
    results = []
    for a in both("extend_int32_no_new_page", {"kind": "hybrid", "size": 64, "page_size": 4}):
        r0 = extend(a, [(0, 2, -1)])
        fresh = extend(a, [(0, 6, -1)])  # takes new pages: int64 on both
        inside = extend(a, [(2, 4, int(r0[1]))])  # continues inside its page: no new page
        results.append((fresh.dtype, inside.dtype, inside.tolist(), int(r0[1])))
    (f_impl, i_impl, v_impl, last), (f_var, i_var, v_var, vlast) = results
    assert f_impl == f_var == torch.int64
    assert i_impl == torch.int64 and i_var == torch.int32
    assert v_impl == [last + 1, last + 2] and v_var == [vlast + 1, vlast + 2]


# ---------------------------------------------------------------- (h) what attention reads


def test_clear_remakes_mapping():
    results = []
    for a in both("clear_remakes_mapping", {"kind": "hybrid", "size": 64, "page_size": 4}):
        old = extend(a, [(0, 5, -1)])
        a.free_swa(old[:4])  # the window moved: these slots lose their peers
        a.clear()
        r = extend(a, [(0, 3, -1)])
        own = a.full_to_swa_index_mapping[r].tolist()
        read = a.get_kvcache().translate_loc_from_full_to_swa(r).tolist()
        nxt = extend(a, [(3, 6, int(r[2]))])
        results.append((own, read, a.full_to_swa_index_mapping[nxt[:1]].item(), own[2]))
    (own, read, nxt_peer, last_peer), (vown, vread, vnxt_peer, vlast_peer) = results
    assert read == own and nxt_peer == last_peer + 1
    assert vread != vown and vread == [0, 0, 0]  # the KV pool reads the mapping from before the clear
    assert vnxt_peer == 1  # the SWA row "continues" on the padding page


# ---------------------------------------------------------------- (i) long requests


def test_extend_block_wraps():
    results = []
    for a in both("extend_block_wraps", {"kind": "hybrid", "size": 8192, "page_size": 16}):
        short = extend(a, [(0, 2000, -1)])
        long = extend(a, [(0, 3000, -1)])
        results.append((len(set(short.tolist())), len(set(long.tolist()))))
    impl, variant = results
    assert impl == (2000, 3000)
    assert variant[0] == 2000 and variant[1] < 3000  # past 2048 tokens the row writes over itself


# ---------------------------------------------------------------- (j) page size 256, larger than a window


def test_expand_tile_128():
    results = []
    for a in both("expand_tile_128", {"kind": "hybrid", "size": 256 * 8, "page_size": 256}):
        r = extend(a, [(0, 300, -1)])
        a.free_swa(r[:256])  # the window moved past the first page
        left = a.full_to_swa_index_mapping[r[:256]].ne(0).sum().item()
        a.free(r[256:])
        a.free_full(r[:256])
        results.append((left, a.swa_available_size()))
    impl, variant = results
    assert impl == (0, 256 * 8)
    assert variant[0] == 128 and variant[1] < 256 * 8  # half a page still paired, its SWA page never released


def test_expand_tile_128_is_right_at_page_size_128():
    impl, variant = both("expand_tile_128", {"kind": "hybrid", "size": 128 * 8, "page_size": 128})
    for a in (impl, variant):
        r = extend(a, [(0, 300, -1)])
        a.free(r)
        assert a.full_to_swa_index_mapping[r].ne(0).sum().item() == 0
        assert a.swa_available_size() == 128 * 8
