"""Pure-SWA allocator, per-request ring mode, request pool, factory, backends."""

import types

import pytest
import torch
from impl_testlib import T, decode, extend, free_set, hybrid, snapshot, tail

from impl import invariants as inv
from impl.backend import (
    BACKEND_NAMES,
    CpuBackend,
    CudaBackend,
    NpuEmulatedBackend,
    emulated_npu_scatter_nd_update_,
    get_backend,
)
from impl.factory import KEYS, make, make_allocator
from impl.kv_pool import SWAKVPool
from impl.req_pool import ReqToTokenPool
from impl.swa import (
    PureSWATokenToKVPoolAllocator,
    SWATokenToKVPoolAllocator,
    is_swa_req_ring,
)


def pure(size=8, need_sort=False):
    kv = SWAKVPool(size, size, 1, "cpu")
    return PureSWATokenToKVPoolAllocator(size, 1, torch.int64, "cpu", kv, need_sort)


# ---------------------------------------------------------------- pure SWA


def test_pure_swa_one_pool_identity_mapping():
    a = pure(8)
    assert a.full_attn_allocator is a.swa_attn_allocator
    assert a.full_to_swa_index_mapping.tolist() == list(range(9)) + [-1]
    x = a.alloc(3)
    assert x.tolist() == [1, 2, 3]
    assert a.translate_loc_from_full_to_swa(x) is x
    assert a.available_size() == a.full_available_size() == a.swa_available_size() == 5
    assert a.new_pages_available(5, 5) and not a.new_pages_available(6, 0)
    assert not is_swa_req_ring(a) and a.swa_ring_cost_tokens == 0


def test_pure_swa_refusals():
    a = pure(8)
    with pytest.raises(NotImplementedError):
        PureSWATokenToKVPoolAllocator(8, 4, torch.int64, "cpu", SWAKVPool(8, 8, 4, "cpu"), False)
    for call in (a.alloc_extend, a.alloc_decode, a.alloc_extend_swa_tail):
        with pytest.raises(NotImplementedError):
            call()
    with pytest.raises(NotImplementedError):
        a.set_full_to_swa_mapping(T(1), T(1))
    with pytest.raises(NotImplementedError):
        a.clear_full_to_swa_mapping(T(1))
    assert a.full_to_swa_index_mapping.tolist() == list(range(9)) + [-1]


def test_pure_swa_frees_once_and_never_frees_slot_zero():
    a = pure(8)
    x = a.alloc(4)
    a.free_full(x)  # nothing: no full pool
    assert a.available_size() == 4
    a.free_segment(x[:2], start_pos=0)
    assert a.available_size() == 6
    a.free_full_segment(x[2:], start_pos=2)
    assert a.available_size() == 6
    a.free_swa(torch.cat([T(0), x[2:]]))
    assert a.available_size() == 8 and 0 not in free_set(a.swa_attn_allocator)


def test_pure_swa_group_and_clear():
    a = pure(8)
    x = a.alloc(4)
    a.free_group_begin()
    a.free(x)
    with pytest.raises(RuntimeError, match="free_group_end first"):
        a.free_group_begin()
    x.fill_(0)
    assert a.available_size() == 4
    a.free_group_end()
    assert free_set(a.swa_attn_allocator) == list(range(1, 9))
    a.alloc(2)
    a.free_group_begin()
    a.clear()
    assert a.free_group is None and a.available_size() == 8
    assert a.full_to_swa_index_mapping[-1].item() == -1


def test_pure_swa_resize():
    a = pure(8)
    a.resize(types.SimpleNamespace(full_max_total_num_tokens=8, swa_max_total_num_tokens=5))
    assert a.size == 5 and a.available_size() == 5
    with pytest.raises(ValueError, match="swa_max_total_num_tokens=9"):
        a.resize(types.SimpleNamespace(full_max_total_num_tokens=9, swa_max_total_num_tokens=9))
    assert a.size == 5


# ---------------------------------------------------------------- ring mode


def ring_alloc(req_slots=4, ring_size=6, size=64, page_size=4):
    pool = ReqToTokenPool(req_slots, size, "cpu")
    kv = SWAKVPool(size, 16, page_size, "cpu", swa_req_ring_size=ring_size)
    a = SWATokenToKVPoolAllocator(size, 16, page_size, torch.int64, "cpu", kv, False, pool)
    return a, pool


def test_ring_accounting_counts_request_slots():
    a, pool = ring_alloc(req_slots=4, ring_size=6, page_size=4)
    assert is_swa_req_ring(a) and a.swa_req_ring
    assert a.swa_ring_cost_tokens == 8  # 6 rounded up to whole pages
    assert a.size_swa == 32 and a.swa_available_size() == 32
    assert a._req_to_token_pool is pool
    slot = pool.alloc()
    assert a.swa_available_size() == 24
    pool.free(slot)
    assert a.swa_available_size() == 32
    # Only the full pool limits tokens.
    assert a.available_size() == a.full_available_size() == 64


def test_ring_alloc_and_free_touch_the_full_side_only():
    a, _ = ring_alloc(size=64, page_size=4)
    swa_before = free_set(a.swa_attn_allocator)
    row = extend(a, [0], [10], [-1])
    assert row.tolist() == list(range(4, 14))
    more = decode(a, [11], [13])
    t = tail(a, 0, 5, -1, 2)
    assert int(a.full_to_swa_index_mapping[:-1].abs().sum()) == 0
    assert free_set(a.swa_attn_allocator) == swa_before
    assert a.full_available_size() == 64 - 12 - 8
    with inv.override_level("strict"):
        a.free(torch.cat([row, more]))
        a.free(t)
    assert a.full_available_size() == 64
    assert a.new_pages_available(16, 10_000)


def test_ring_resize_keeps_ring_capacity():
    a, _ = ring_alloc(req_slots=4, ring_size=6, size=64, page_size=4)
    a.resize(types.SimpleNamespace(full_max_total_num_tokens=32, swa_max_total_num_tokens=8))
    assert a.size_full == 32 and a.size_swa == 32 and a.full_available_size() == 32


def test_ring_needs_a_request_pool_and_pages():
    kv = SWAKVPool(64, 16, 4, "cpu", swa_req_ring_size=6)
    with pytest.raises(ValueError, match="req_to_token_pool"):
        SWATokenToKVPoolAllocator(64, 16, 4, torch.int64, "cpu", kv, False)
    kv1 = SWAKVPool(64, 16, 1, "cpu", swa_req_ring_size=6)
    with pytest.raises(NotImplementedError, match="page_size > 1"):
        SWATokenToKVPoolAllocator(64, 16, 1, torch.int64, "cpu", kv1, False, ReqToTokenPool(2, 8))


def test_req_pool():
    p = ReqToTokenPool(3, 16, "cpu")
    assert p.available_size() == 3
    got = [p.alloc() for _ in range(3)]
    assert got == [0, 1, 2] and p.alloc() is None
    p.free(1)
    with pytest.raises(ValueError, match="slot 1"):
        p.free(1)
    with pytest.raises(ValueError):
        p.free([0, 0])
    assert p.available_size() == 1
    assert p.req_to_token.shape == (3, 16)


# ---------------------------------------------------------------- factory


def base_cfg(**kw):
    c = dict(kind="hybrid", size=64, size_swa=32, page_size=4, device="cpu",
             need_sort=False, ring_size=None, check_level="warn")
    c.update(kw)
    return c


def test_factory_builds_hybrid_pure_and_ring():
    a = make_allocator(base_cfg())
    assert isinstance(a, SWATokenToKVPoolAllocator) and a.dtype == torch.int64
    assert (a.size_full, a.size_swa, a.page_size) == (64, 32, 4)
    p = make_allocator(base_cfg(kind="pure_swa", page_size=1))
    assert isinstance(p, PureSWATokenToKVPoolAllocator) and p.size == 32
    r = make(base_cfg(ring_size=6, req_slots=3))
    assert is_swa_req_ring(r) and r.swa_available_size() == 24
    assert r._req_to_token_pool.available_size() == 3


def test_factory_applies_check_level():
    make_allocator(base_cfg(check_level="strict"))
    assert inv.current_level() is inv.Level.STRICT
    make_allocator(base_cfg(check_level="off"))
    assert inv.current_level() is inv.Level.OFF


@pytest.mark.parametrize(
    "key,value",
    [("kind", "mixed"), ("size", 0), ("size", True), ("page_size", "4"), ("need_sort", 1),
     ("ring_size", -2), ("check_level", "loud"), ("backend", "tpu"), ("device", "nowhere"),
     ("size_swa", 1.5), ("bogus", 1)],
)
def test_factory_bad_values_name_the_key(key, value):
    with pytest.raises(ValueError, match=key):
        make_allocator(base_cfg(**{key: value}))


def test_factory_missing_keys():
    with pytest.raises(ValueError, match="page_size"):
        make_allocator({"kind": "hybrid", "size": 8})
    with pytest.raises(ValueError, match="req_slots"):
        make_allocator(base_cfg(ring_size=4))
    assert set(KEYS) >= {"kind", "size", "size_swa", "page_size", "device", "need_sort",
                         "ring_size", "req_slots", "check_level", "backend"}


def test_factory_unsupported_configurations():
    with pytest.raises(NotImplementedError):
        make_allocator(base_cfg(kind="pure_swa", page_size=4))
    with pytest.raises(NotImplementedError):
        make_allocator(base_cfg(kind="pure_swa", page_size=1, ring_size=4, req_slots=2))
    with pytest.raises(NotImplementedError):
        make_allocator(base_cfg(page_size=1, ring_size=4, req_slots=2))
    if not torch.cuda.is_available():
        with pytest.raises(NotImplementedError):
            make_allocator(base_cfg(device="cuda"))


# ---------------------------------------------------------------- backends


def test_backend_selection():
    assert isinstance(get_backend("auto", "cpu"), CpuBackend)
    assert isinstance(get_backend("auto", torch.device("cuda", 0)), CudaBackend)
    assert isinstance(get_backend("npu_emulated"), NpuEmulatedBackend)
    assert set(BACKEND_NAMES) == {"auto", "cpu", "cuda", "npu", "npu_emulated"}
    with pytest.raises(ValueError, match="backend='tpu'"):
        get_backend("tpu")
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="npu_emulated"):
            get_backend("npu")


def test_emulated_scatter_nd_update_matches_index_assignment():
    g = torch.Generator().manual_seed(0)
    target = torch.zeros(50, dtype=torch.int64)
    idx = torch.randperm(50, generator=g)[:20]
    vals = torch.randint(1, 99, (20,), generator=g)
    want = target.clone()
    want[idx] = vals
    out = emulated_npu_scatter_nd_update_(target, idx.unsqueeze(-1), vals)
    assert out is target and torch.equal(target, want)
    # Rows of a 2-D target, addressed by (N, 1) coordinates.
    t2 = torch.zeros(4, 3, dtype=torch.int64)
    emulated_npu_scatter_nd_update_(t2, T(2, 0).unsqueeze(-1), torch.ones(2, 3, dtype=torch.int64))
    assert t2.sum(1).tolist() == [3, 0, 3, 0]
    with pytest.raises(ValueError):
        emulated_npu_scatter_nd_update_(t2, torch.zeros(2, 3, dtype=torch.int64), T(1, 1))


def test_backend_writes_agree():
    idx, vals = T(3, 7, 1), T(30, 70, 10)
    outs = []
    for name in ("cpu", "cuda", "npu_emulated"):
        m = torch.full((10,), 5, dtype=torch.int64)
        b = get_backend(name)
        b.scatter(m, idx, vals)
        b.zero_fill(m, T(7, 9))
        outs.append(m.tolist())
    assert outs[0] == outs[1] == outs[2]
    assert outs[0] == [5, 10, 5, 30, 5, 5, 5, 0, 5, 0]


def _workload(a):
    """A fixed paged workload touching every mapping write; returns what it saw."""
    seen = []
    r1 = extend(a, [0, 0], [6, 9], [-1, -1])
    seen.append(r1.tolist())
    seen.append(decode(a, [7, 10], [9, r1[-1].item()]).tolist())
    t = tail(a, 0, 7, -1, 3)
    seen.append(t.tolist())
    a.free_swa(r1[:4])
    a.free_full(r1[:4])
    a.free_group_begin()
    a.free_segment(r1[6:], start_pos=0)
    a.free(t)
    a.free_group_end()
    seen.append(a.full_to_swa_index_mapping.tolist())
    seen.append(snapshot(a))
    return seen


@pytest.mark.parametrize("page_size", [1, 4])
def test_npu_emulated_backend_equals_cpu_backend(page_size):
    results = []
    for name in ("cpu", "cuda", "npu_emulated"):
        a = hybrid(size=64, size_swa=48, page_size=page_size, backend=name)
        assert a._backend.name == name
        if page_size == 1:
            x = a.alloc(5)
            a.free_swa(x[:2])
            a.free_full(x[:2])
            a.free(x[2:])
            y = a.alloc(7)
            results.append((x.tolist(), y.tolist(), snapshot(a)))
        else:
            results.append(_workload(a))
    assert results[0] == results[1] == results[2]


# ---------------------------------------------------------------- KV pool


def test_kv_pool_tags_translation_and_cpu_copies():
    kv = SWAKVPool(16, 8, 4, "cpu")
    assert len(kv.full_kv_pool.kv_buffer) == 20 and len(kv.swa_kv_pool.kv_buffer) == 12
    assert kv.full_kv_pool.kv_buffer.dtype == torch.int64 and kv.swa_req_ring_size is None
    with pytest.raises(RuntimeError, match="register_mapping"):
        kv.translate_loc_from_full_to_swa(T(1))
    m = torch.zeros(21, dtype=torch.int64)
    kv.register_mapping(m)
    m[5] = 7
    assert kv.translate_loc_from_full_to_swa(T(5, 4)).tolist() == [7, 0]
    kv.invalidate_loc_cache()
    kv.swa_kv_pool.kv_buffer[7] = 77
    copy = kv.swa_kv_pool.get_cpu_copy(T(7))
    kv.swa_kv_pool.load_cpu_copy(copy + 1, T(3))
    assert kv.swa_kv_pool.kv_buffer[3].item() == 78
    with pytest.raises(ValueError):
        kv.swa_kv_pool.load_cpu_copy(copy, T(1, 2))


def test_every_allocator_reports_invariant_hits():
    from impl.token import TokenToKVPoolAllocator

    a = hybrid(size=8, size_swa=8, page_size=1)
    full = a.alloc(1)
    with inv.override_level("warn"):
        a.free_full(full)
    sub = TokenToKVPoolAllocator(4, torch.int64, "cpu", None, False)
    assert sub.invariant_hits()["swa.peer_released"] == a.invariant_hits()["swa.peer_released"] == 1


def test_factory_layout_key():
    from impl import make_allocator

    with pytest.raises(ValueError, match=r"config key 'layout': must be one of 'torch', 'triton', got 'cuda'"):
        make_allocator({"kind": "hybrid", "size": 16, "page_size": 4, "layout": "cuda"})
    a = make_allocator({"kind": "hybrid", "size": 16, "page_size": 4})
    assert a.layout == "torch" and a.full_attn_allocator.layout == "torch"
