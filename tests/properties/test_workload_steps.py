"""The scheduler-shaped steps (prefill batches with cache hits, retract and resume,
cache evictions, empty calls) on the bundled impl, and faults in them that the
driver must name.

Each scenario replays a fixed list of steps; the label counts must be exactly those
given, so a label counted for another event fails the test, and each step must leave
the model and the impl agreeing (replay runs the closing census).
"""

import pytest
import torch

from impl import make_allocator
from impl.kv_pool import SWAKVPool
from impl.swa import SWATokenToKVPoolAllocator
from properties.lockstep import LockstepFailure, replay
from properties.steps import (
    NEW, AdmitTail, CacheFree, Decode, Empty, Evict, Finish, GroupBegin, Prefill, Resize, Resume, Retract,
    StepFormatError,
)
from properties.targets import resolve
from reference import names


def hybrid(ps, **kw):
    return {"kind": "hybrid", "size": 64 * ps, "size_swa": 32 * ps, "page_size": ps, "check_level": "strict", **kw}


SCENARIOS = {
    "mixed prefill, cache hit, take-over": (hybrid(4), [
        Prefill(((0, NEW, 0, 8), (1, NEW, 0, 6))),  # 0 ends on a page boundary, 1 inside one
        Finish(0, "cache"),  # all 8 positions kept
        Finish(1, "cache"),  # 6 positions, the last still paired in step: kept whole
        Prefill(((2, 0, 4, 3), (3, NEW, 0, 5), (4, 1, 6, 2))),  # a shared hit, a new one, a take-over
    ], {
        "finished into the cache": 2,
        "prefill: new request": 3,
        "prefill: cache hit": 2,
        "prefill: new and continuing requests in one batch": 0,
        "prefill: cached entry taken over mid-page": 1,
        "extend from a prefix inside a page": 1,  # the take-over continues page 1's last page
    }),
    "a cached prefix shared by running requests": (hybrid(4), [
        Prefill(((0, NEW, 0, 8),)),
        Finish(0, "cache"),
        Prefill(((1, 0, 4, 6),)),  # its first page
        Prefill(((2, 0, 8, 9),)),  # all of it, while request 1 still uses the first page
        Decode((2, 1)),
        Finish(1, "free"),
        Finish(2, "free"),
        CacheFree("free", ((0, 0, 8),)),  # evictable once neither uses it
    ], {
        "prefill: new request": 1,
        "finished into the cache": 1,
        "prefill: cache hit": 2,
        "prefill: cache hit on a prefix in use": 1,
        "finished by free": 2,
        "cache evicted by free": 1,
    }),
    "continuations mixed with new requests": (hybrid(1), [
        Prefill(((0, NEW, 0, 3),)),
        Prefill(((1, NEW, 0, 2), (0, 0, 3, 4))),
        Decode((1, 0)),
    ], {
        "prefill: new request": 2,
        "prefill: chunked continuation": 1,
        "prefill: new and continuing requests in one batch": 1,
    }),
    "retract a batch and resume it": (hybrid(2), [
        Prefill(((0, NEW, 0, 5), (1, NEW, 0, 4))),
        Evict(0, 0, 2),
        Retract((1, 0)),
        Resume((0, 1)),
        Decode((0, 1)),
    ], {
        "prefill: new request": 2,
        "window evicted": 1,
        "retracted": 1,
        "retracted a batch": 1,
        "resumed": 1,
        "host copy's request arguments checked": 4,  # two copies out, two back
        "decode onto a new page": 1,  # request 1 at 4
    }),
    "cache evictions over several entries": (hybrid(2), [
        Prefill(((0, NEW, 0, 4), (1, NEW, 0, 6))),
        Finish(0, "cache"),
        Finish(1, "cache"),
        CacheFree("free_swa", ((1, 0, 4), (0, 2, 4))),
        CacheFree("free_full", ((0, 2, 4),)),  # its last page has no SWA KV left
        CacheFree("free", ((1, 4, 6), (0, 0, 2)), True),
    ], {
        "prefill: new request": 2,
        "finished into the cache": 2,
        "cache evicted by free_swa over several entries": 1,
        "cache evicted by free_full": 1,
        "cache evicted by free over several entries": 1,
    }),
    "empty calls": (hybrid(1), [Empty("free"), Empty("free_swa"), Empty("free_full"), Empty("free_segment"), Empty("alloc")], {
        "empty call": 5,
    }),
    "empty paged calls": (hybrid(4), [
        Prefill(((0, NEW, 0, 5),)),
        Empty("alloc_extend"), Empty("alloc_decode"), Empty("free_full_segment"), Empty("free_swa_segment"),
    ], {
        "prefill: new request": 1,
        "empty call": 4,
    }),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_labels(name):
    config, steps, want = SCENARIOS[name]
    ls = replay(config, steps, resolve("impl"))
    got = {k: v for k, v in ls.labels.items() if v}
    assert got == {k: v for k, v in want.items() if v}


def test_retract_frees_everything_and_resume_restores_it():
    config, steps, _ = SCENARIOS["retract a batch and resume it"]
    ls = replay(config, steps[:3], resolve("impl"))
    assert ls.model.full_available() == config["size"] and not ls.rows and set(ls.retracted) == {0, 1}
    ls = replay(config, steps, resolve("impl"))
    assert sorted(ls.rows) == [0, 1] and not ls.retracted


class _LoadSkipsSwa(SWAKVPool):
    """load_cpu_copy writes the full KV back but not the SWA KV."""

    def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None, req_pool_index=None):
        self.full_kv_pool.load_cpu_copy(kv_cache_cpu["full"], indices.to(torch.int64))


def _load_skips_swa(config):
    a = make_allocator(config)
    a.get_kvcache().__class__ = _LoadSkipsSwa
    return a


class _StaleKVPoolMapping(SWATokenToKVPoolAllocator):
    """clear() gives the allocator a new mapping tensor the KV pool never sees."""

    def clear(self):
        super().clear()
        self.full_to_swa_index_mapping = self.full_to_swa_index_mapping.clone()


def _stale_mapping(config):
    a = make_allocator(config)
    a.__class__ = _StaleKVPoolMapping
    a.clear()
    return a


class _Int32Alloc(SWATokenToKVPoolAllocator):
    def alloc(self, need_size):
        out = super().alloc(need_size)
        return None if out is None else out.to(torch.int32)


def _int32(config):
    a = make_allocator(config)
    a.__class__ = _Int32Alloc
    return a


class _ResizeKeepsSize(SWATokenToKVPoolAllocator):
    """resize() shrinks the pools but size_full still reports the built size."""

    def resize(self, config):
        built = self._size_full
        super().resize(config)
        self._size_full = built


class _TransferUntranslated(SWATokenToKVPoolAllocator):
    """A KV transfer is handed the full slot ids instead of their SWA peers."""

    def translate_swa_indices_for_transfer(self, kv_indices):
        return kv_indices


class _GroupFlagStale(SWATokenToKVPoolAllocator):
    """is_not_in_free_group answers as if no group were ever opened."""

    is_not_in_free_group = True


class _EmptyDecodeNone(SWATokenToKVPoolAllocator):
    """A decode batch of no requests returns None, as if a pool were short."""

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc):
        return None if len(seq_lens) == 0 else super().alloc_decode(seq_lens, seq_lens_cpu, last_loc)


class _ResizeKeepsSubSize(SWATokenToKVPoolAllocator):
    """resize() shrinks the hybrid's own sizes and free lists, but the SWA
    sub-allocator still reports the size and page count it was built with."""

    def resize(self, config):
        sub = self.swa_attn_allocator
        size, pages = sub.size, getattr(sub, "num_pages", None)
        super().resize(config)
        sub.size = size
        if pages is not None:
            sub.num_pages = pages


class _HostCopyDropsRequest(SWATokenToKVPoolAllocator):
    """get_cpu_copy hands its KV pool the indices only: the request's row in the
    request pool (req_pool_index) is lost on the way."""

    def get_cpu_copy(self, indices, mamba_indices=None, req_pool_index=None):
        return self.get_kvcache().get_cpu_copy(indices, mamba_indices=mamba_indices)


class _TranslateInt32(SWATokenToKVPoolAllocator):
    """translate_loc_from_full_to_swa hands attention int32 slot ids."""

    def translate_loc_from_full_to_swa(self, kv_indices):
        return super().translate_loc_from_full_to_swa(kv_indices).to(torch.int32)


class _TranslateClampsNoPrefix(SWATokenToKVPoolAllocator):
    """translate_loc_from_full_to_swa clamps ids below 1, so a last_loc of -1 (no
    prefix) reads the padding slot's SWA KV."""

    def translate_loc_from_full_to_swa(self, kv_indices):
        return super().translate_loc_from_full_to_swa(kv_indices).clamp(min=0)


class _SizeSwaHalved(SWATokenToKVPoolAllocator):
    """size_swa from a true division: a float, and half of what the pool holds."""

    @property
    def size_swa(self):
        return self._size_swa / 2


class _RingCostUnrounded(SWATokenToKVPoolAllocator):
    """swa_ring_cost_tokens, which a scheduler's prefill budget reads in ring mode,
    gives the ring size itself, not rounded up to whole pages as the accounting is."""

    @property
    def swa_ring_cost_tokens(self):
        return self.get_kvcache().swa_req_ring_size


class _TailZeroWantsSwaPage(SWATokenToKVPoolAllocator):
    """alloc_extend_swa_tail asks the SWA pool for a page even for a tail of 0, so a
    request that keeps no SWA KV is refused while the SWA pool is full."""

    def alloc_extend_swa_tail(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens, swa_tail_len):
        if swa_tail_len == 0 and self.swa_attn_allocator.available_size() < self.page_size:
            return None
        return super().alloc_extend_swa_tail(prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens, swa_tail_len)


def _fact(side: str | None, **facts):
    """The impl with attributes of one sub-allocator (`side`), or of the hybrid itself
    (None), changed after construction."""
    def make(config):
        a = make_allocator(config)
        sub = a if side is None else getattr(a, side)
        for key, value in facts.items():
            if key == "kvcache":
                sub._kvcache = value(a)
            else:
                setattr(sub, key, value)
        return a

    return make


def _rebound(cls):
    def make(config):
        a = make_allocator(config)
        a.__class__ = cls
        return a

    return make


@pytest.mark.parametrize("target, config, steps, invariant", [
    (_rebound(_ResizeKeepsSize), hybrid(4), [Prefill(((0, NEW, 0, 5),)), Resize(32, 32)], names.CAPACITY),
    (_rebound(_TransferUntranslated), hybrid(1), [Prefill(((0, NEW, 0, 3), (1, NEW, 0, 2))), Finish(0, "free")], names.KV_RESOLVE),
    (_rebound(_GroupFlagStale), hybrid(1), [Prefill(((0, NEW, 0, 3),)), GroupBegin(), Finish(0, "free")], names.GROUP_DEFERRED),
    (_rebound(_EmptyDecodeNone), hybrid(4), [Empty("alloc_decode")], names.CAPACITY),
    (_load_skips_swa, hybrid(1), [Prefill(((0, NEW, 0, 3),)), Retract((0,)), Prefill(((1, NEW, 0, 3),)), Resume((0,))], names.KV_INTEGRITY),
    (_stale_mapping, hybrid(1), [Prefill(((0, NEW, 0, 3),))], names.KV_RESOLVE),
    (_rebound(_HostCopyDropsRequest), hybrid(2), [Prefill(((0, NEW, 0, 3),)), Retract((0,))], names.KV_INTEGRITY),
    (_int32, hybrid(1), [Prefill(((0, NEW, 0, 2),))], names.DTYPE),
    (_rebound(_TranslateInt32), hybrid(1), [Prefill(((0, NEW, 0, 2),))], names.DTYPE),
    (_rebound(_TranslateClampsNoPrefix), hybrid(4), [Prefill(((0, NEW, 0, 2),))], names.SENTINEL),
    (_rebound(_TailZeroWantsSwaPage), hybrid(4), [Prefill(((0, NEW, 0, 128),)), AdmitTail(1, 3, 0)], names.CAPACITY),
    (_rebound(_RingCostUnrounded), hybrid(4, ring_size=5, req_slots=3), [Prefill(((0, NEW, 0, 2),))], names.CAPACITY),
    (_rebound(_SizeSwaHalved), hybrid(4), [Prefill(((0, NEW, 0, 2),))], names.CAPACITY),
    (_rebound(_ResizeKeepsSubSize), hybrid(4), [Prefill(((0, NEW, 0, 5),)), Resize(32, 24)], names.CAPACITY),
    (_fact("full_attn_allocator", dtype=torch.float16), hybrid(1), [Prefill(((0, NEW, 0, 2),))], names.DTYPE),
    (_fact(None, dtype=None), hybrid(4), [Prefill(((0, NEW, 0, 2),))], names.DTYPE),
    (_fact("swa_attn_allocator", device="meta"), hybrid(4), [Prefill(((0, NEW, 0, 2),))], names.DTYPE),
    (_fact("swa_attn_allocator", kvcache=lambda a: a.get_kvcache().full_kv_pool), hybrid(2), [Prefill(((0, NEW, 0, 2),))], names.KV_RESOLVE),
    (_fact(None, need_sort=None), hybrid(4, need_sort=True), [Prefill(((0, NEW, 0, 2),))], names.CAPACITY),
    (_fact("full_attn_allocator", need_sort=True), hybrid(1), [Prefill(((0, NEW, 0, 2),))], names.CAPACITY),
])
def test_driver_names_the_fault(target, config, steps, invariant):
    with pytest.raises(LockstepFailure) as info:
        replay(config, steps, target)
    assert info.value.invariant == invariant


@pytest.mark.parametrize("steps, field", [
    ([Prefill(((0, NEW, 2, 3),))], "batch"),  # a new request from a prefix
    ([Prefill(((0, NEW, 0, 3),)), Prefill(((0, NEW, 0, 1),))], "batch"),  # not new
    ([Prefill(((0, 5, 2, 3),))], "batch"),  # no such cached entry
    ([Prefill(((0, NEW, 0, 4),)), Finish(0, "cache"), Prefill(((1, 0, 2, 1), (2, 0, 4, 1)))], "batch"),  # an entry twice
    ([Resume((3,))], "rids"),
    ([Prefill(((0, NEW, 0, 4),)), Finish(0, "cache"), CacheFree("free", ((0, 0, 2),))], "pieces"),  # not the tail
])
def test_steps_that_cannot_apply_name_the_field(steps, field):
    with pytest.raises(StepFormatError) as info:
        replay(hybrid(2), steps, resolve("impl"))
    assert info.value.field == field
