"""Seeded-bug variants of the bundled allocator (SPEC 7 and SPEC 2.9).

Each variant is a target factory ``make(config) -> allocator`` with the same
configuration keys as ``impl.make_allocator``. It builds the bundled
allocator and rebinds ``__class__`` (of the allocator, or of one of its
sub-allocators) to a small subclass whose one overridden method carries the
bug. Everything else is the bundled code, so a failure on a variant is the
bug's and nothing else's.

``VARIANTS`` maps each name to its factory; ``EXPECTED`` maps it to the
invariants (reference/names.py) the lockstep harness may report first when it
finds the bug, the one the variant's docstring describes first.

The allocator itself never imports this module, and the default target is the
bundled impl: a variant runs only when named.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from impl import make_allocator
from impl.base import BaseTokenToKVPoolAllocator, _check_page_aligned
from impl.kv_pool import SWAKVPool, TagKVPool
from impl.paged import PagedTokenToKVPoolAllocator, extend_layout, get_num_new_pages
from impl.swa import PureSWATokenToKVPoolAllocator, SWATokenToKVPoolAllocator

Factory = Callable[[dict], Any]

_subclasses: dict[tuple[type, type], type] = {}


def _rebind(obj, mixin: type) -> None:
    """Give a sub-allocator the class ``mixin`` + its own class, mixin first in
    the MRO (mixin derives from the common base, so the layouts agree)."""
    base = type(obj)
    cls = _subclasses.get((mixin, base))
    if cls is None:
        cls = type(f"{mixin.__name__.lstrip('_')}_{base.__name__}", (mixin, base), {"__module__": __name__})
        _subclasses[(mixin, base)] = cls
    obj.__class__ = cls


def _variant(
    name: str,
    hybrid: Optional[type] = None,
    pure: Optional[type] = None,
    subs: Optional[Callable[[Any], list]] = None,
    sub_mixin: Optional[type] = None,
    setup: Optional[Callable[[Any], None]] = None,
) -> Factory:
    """A factory: the bundled allocator rebound to the subclass ``hybrid`` or
    ``pure`` (by kind), each sub-allocator that ``subs`` picks rebound with
    ``sub_mixin``, then ``setup``.

    The allocator's class is rebound even where the bug has no subclass for the
    configuration's kind, so it always says which variant it is.
    """
    doc = (hybrid or pure or sub_mixin).__doc__
    ns = {"__module__": __name__, "__doc__": doc, "variant": name}
    tops = {
        False: type(name, (hybrid or SWATokenToKVPoolAllocator,), dict(ns)),
        True: type(name, (pure or PureSWATokenToKVPoolAllocator,), dict(ns)),
    }

    def make(config: dict):
        a = make_allocator(config)
        if sub_mixin is not None:
            done: set[int] = set()
            for sub in subs(a):
                if id(sub) not in done:
                    done.add(id(sub))
                    _rebind(sub, sub_mixin)
        a.__class__ = tops[isinstance(a, PureSWATokenToKVPoolAllocator)]
        if setup is not None:
            setup(a)
        return a

    make.__name__ = make.__qualname__ = name
    make.__doc__ = doc
    return make


def _is_paged_sub(sub) -> bool:
    return isinstance(sub, PagedTokenToKVPoolAllocator)


def _full_sub(a) -> list:
    return [a.full_attn_allocator]


def _paged_subs(a) -> list:
    return [s for s in (a.full_attn_allocator, a.swa_attn_allocator) if _is_paged_sub(s)]


def _both_subs(a) -> list:
    return [a.full_attn_allocator, a.swa_attn_allocator]


def _paged_hybrid(a) -> bool:
    return a.page_size > 1 and not a._swa_req_ring


# --------------------------------------------------------------------------
# SPEC 7, bug class 1: full side first, free group holds raw full indices.


class _RawGroupFullFirst(SWATokenToKVPoolAllocator):
    """Bug class 1. ``free`` releases the full side before the SWA side, and a
    free group holds the raw full indices (of ``free`` and of ``free_swa``),
    reading the mapping only at ``free_group_end``: a load-back inside the group
    re-points the held SWA release, and until the flush the freed slots keep
    their peers. Re-creates sglang's free before the SWA-first rewrite, whose
    group flushed ``free(cat(group))``. The harness sees the freed slots still
    paired right after the call (``map.live``), or, first, a free its guard refuses
    after the full side already went (``alloc.atomic``)."""

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(self._copy_for_free_group(free_index))
            return
        self.full_attn_allocator.free(free_index)
        self.free_swa(free_index)

    def free_swa(self, free_index: torch.Tensor) -> None:
        if self.free_group is not None and free_index.numel():
            self._raw_swa_group.append(self._copy_for_free_group(free_index))
            return
        super().free_swa(free_index)

    def free_group_begin(self) -> None:
        super().free_group_begin()
        self._raw_swa_group = []

    def free_group_end(self) -> None:
        held, self.free_group = self.free_group, None
        held_swa, self._raw_swa_group = self._raw_swa_group, []
        if held_swa:
            self.free_swa(torch.cat(held_swa))
        if held:
            self.free(torch.cat(held))
        self.swa_free_group = []
        self.full_attn_allocator.free_group_end()

    def clear(self) -> None:
        super().clear()
        self._raw_swa_group = []


def _init_raw_group(a) -> None:
    a._raw_swa_group = []


# --------------------------------------------------------------------------
# SPEC 7, bug class 2: free_swa clears the mapping of the freed tokens only.


class _FreeSwaTokensOnly(SWATokenToKVPoolAllocator):
    """Bug class 2. Paged ``free_swa`` reads and clears the mapping only at the
    freed tokens, then releases their SWA pages whole (as the SWA release did
    before pages were checked for other pairs): the other tokens of each full
    page keep peers into a freed SWA page. Re-creates the upstream free_swa
    before it expanded to whole full pages. Expected: ``map.live``."""

    def free_swa(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0 or not _paged_hybrid(self):
            return super().free_swa(free_index)
        swa = self.full_to_swa_index_mapping[free_index]
        self.clear_full_to_swa_mapping(free_index)
        if self.free_group is not None:
            self.swa_free_group.append(swa)
            return
        self.swa_attn_allocator.free(swa[swa > 0])


# --------------------------------------------------------------------------
# SPEC 7, bug class 3 (the seed's own behaviour): tail 0 writes no mapping.


class _TailZeroStale(SWATokenToKVPoolAllocator):
    """Bug class 3, and the seed's alloc_extend_swa_tail as it stands: the
    mapping of the new full slots is cleared only before a non-empty tail, so an
    extend with ``swa_tail_len == 0`` hands out recycled full pages that keep
    their earlier owner's peers. Stale entries exist after a ``free_full`` of
    paired slots that the guard tolerated (level warn or off). Expected:
    ``map.live`` on the stale head."""

    def alloc_extend_swa_tail(
        self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens, swa_tail_len
    ):
        if int(swa_tail_len) != 0 or not _paged_hybrid(self) or len(seq_lens_cpu) != 1 or len(prefix_lens_cpu) != 1:
            return super().alloc_extend_swa_tail(
                prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens, swa_tail_len
            )
        PagedTokenToKVPoolAllocator.check_extend_args(
            prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens
        )
        n = get_num_new_pages(seq_lens=seq_lens_cpu, page_size=self.page_size, prefix_lens=prefix_lens_cpu)
        if not self.new_pages_available(n, 0):
            return None
        return self.full_attn_allocator._extend(prefix_lens, seq_lens, last_loc, extend_num_tokens, n)


# --------------------------------------------------------------------------
# SPEC 7, bug class 4: no `> 0` filter in the SWA release.


class _ReleasePadding(SWATokenToKVPoolAllocator):
    """Bug class 4. The paged SWA release drops the ``> 0`` filter: whole-page
    expansion reads unpaired slots as 0, and page 0 (the padding page) joins
    the SWA free list. Re-creates the release before the filter was added.
    Expected: ``pool.padding_reserved``."""

    def _release_swa(self, swa_indices: torch.Tensor) -> None:
        if self.page_size == 1:
            return super()._release_swa(swa_indices)
        ps = self.page_size
        pages = swa_indices // ps
        on_page = pages[:, None] * ps + torch.arange(ps, device=swa_indices.device)[None, :]
        still_paired = self._swa_to_full[on_page].ne(0).any(dim=1)
        self.swa_attn_allocator.free(swa_indices[~still_paired])


# --------------------------------------------------------------------------
# SPEC 7, bug class 5: a free group holds the caller's view.


class _GroupHoldsView(BaseTokenToKVPoolAllocator):
    """Bug class 5. ``_copy_for_free_group`` returns its argument, so a free
    group holds the caller's view of a request's token row; the scheduler
    zero-fills the row once the request is done, and the flush frees slot 0
    (page 0) instead of the request's slots. Re-creates the group before it
    cloned. Expected: ``pool.padding_reserved`` at the flush census."""

    @staticmethod
    def _copy_for_free_group(free_index: torch.Tensor) -> torch.Tensor:
        return free_index


class _GroupHoldsViewPure(PureSWATokenToKVPoolAllocator):
    """Bug class 5 on the pure SWA allocator, which keeps its own group."""

    _copy_for_free_group = staticmethod(_GroupHoldsView._copy_for_free_group)


# --------------------------------------------------------------------------
# SPEC 7, bug class 6: clear() and its two halves.


class _ClearWipesSentinel(SWATokenToKVPoolAllocator):
    """Bug class 6a. ``clear()`` fills the whole mapping with 0, the trailing
    -1 sentinel included, so a request without a prefix (last_loc -1) reads the
    padding slot as its SWA predecessor. Expected: ``map.sentinel``."""

    def clear(self) -> None:
        super().clear()
        self.full_to_swa_index_mapping.fill_(0)


class _ClearLeavesGroupOpen(SWATokenToKVPoolAllocator):
    """Bug class 6b. ``clear()`` resets the pools and the mapping but not the
    free group: a group open at the clear stays open, holding frees of slots the
    clear already returned. Expected: ``group.deferred`` (the census sees the
    allocator's group open, the model's closed)."""

    def clear(self) -> None:
        group = self.free_group
        super().clear()
        self.free_group = group


class _ClearLeavesGroupOpenPure(PureSWATokenToKVPoolAllocator):
    """Bug class 6b on the pure SWA allocator."""

    def clear(self) -> None:
        group = self.free_group
        super().clear()
        self.free_group = group


# --------------------------------------------------------------------------
# SPEC 7, bug class 7: free_full without the swa.peer_released guard.


class _FreeFullUnguarded(SWATokenToKVPoolAllocator):
    """Bug class 7. ``free_full`` releases full slots without checking that
    their peers are gone (no ``swa.peer_released`` guard): a slot freed while
    paired strands its SWA slot and leaves a stale entry. Expected:
    ``swa.peer_released`` (the guard must fire and does not)."""

    def free_full(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        self.full_attn_allocator.free(free_index)


# --------------------------------------------------------------------------
# SPEC 7, bug class 8: page expansion.


class _ExpandDropsPage(SWATokenToKVPoolAllocator):
    """Bug class 8a. ``_expand_to_full_pages`` takes one representative per
    ``page_size`` indices at the end of each group (``indices[page_size - 1 ::
    page_size]``), a floor where a ceiling was meant: a range whose last page
    is partial (a request ending inside a page) loses that page: its SWA page
    is never released (``pool.no_leak``) and its peers stay mapped (``map.live``)."""

    def _expand_to_full_pages(self, indices: torch.Tensor) -> torch.Tensor:
        return super()._expand_to_full_pages(indices[self.page_size - 1 :: self.page_size])


class _ExpandAddsNeighbour(SWATokenToKVPoolAllocator):
    """Bug class 8b. ``_expand_to_full_pages`` uses ``page_size + 1`` offsets,
    so each page's expansion also takes the first slot of the next page: that
    slot loses its peer although its owner still runs."""

    def _expand_to_full_pages(self, indices: torch.Tensor) -> torch.Tensor:
        ps = self.page_size
        base = (indices.to(torch.int64) // ps) * ps
        offsets = torch.arange(ps + 1, dtype=torch.int64, device=indices.device)
        return (base[:, None] + offsets[None, :]).reshape(-1)


# --------------------------------------------------------------------------
# SPEC 7, bug class 9: ring accounting.


class _RingCountsAllSlots(SWATokenToKVPoolAllocator):
    """Bug class 9a. In ring mode ``swa_available_size()`` counts every request
    slot (the capacity at construction), not the free ones: SWA room is
    over-credited by each admitted request's ring. Expected: ``pool.capacity``."""

    def swa_available_size(self) -> int:
        if self._swa_req_ring:
            return self._size_swa
        return super().swa_available_size()


def _ring_cost_unrounded(a) -> None:
    if a._swa_req_ring:
        ring = a.get_kvcache().swa_req_ring_size
        a._swa_ring_cost = ring
        a._size_swa = a._req_to_token_pool.available_size() * ring


class _RingCostUnrounded(SWATokenToKVPoolAllocator):
    """Bug class 9b. The ring cost is ``ring_size`` tokens, not rounded up to
    whole pages, although each ring occupies whole pages: SWA availability is
    counted in the wrong unit whenever ring_size is not a page multiple.
    Expected: ``pool.capacity``."""


# --------------------------------------------------------------------------
# Seed findings (SPEC 2.9).


class _SeedDecodeNotAtomic(SWATokenToKVPoolAllocator):
    """Seed finding: hybrid ``alloc_decode`` takes the full side's pages before
    knowing that the SWA side has room; when the SWA pool is short it returns
    None with the full pages gone. Expected: ``alloc.atomic``."""

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc):
        if not _paged_hybrid(self):
            return super().alloc_decode(seq_lens, seq_lens_cpu, last_loc)
        PagedTokenToKVPoolAllocator.check_decode_args(seq_lens, seq_lens_cpu, last_loc)
        n = get_num_new_pages(seq_lens=seq_lens_cpu, page_size=self.page_size, decode=True)
        swa_last_loc = self.translate_loc_from_full_to_swa(last_loc)
        full = self.full_attn_allocator._decode(seq_lens, last_loc, n)
        swa = self.swa_attn_allocator._decode(seq_lens, swa_last_loc, n)
        if full is None or swa is None:
            return None
        self.set_full_to_swa_mapping(full, swa)
        return full


class _SeedTailPacked(SWATokenToKVPoolAllocator):
    """Seed finding: ``alloc_extend_swa_tail`` packs the tail's SWA slots from
    offset 0 of fresh pages instead of keeping the full slots' in-page offsets.
    The SWA row is then out of step with the full row: a later decode that the
    full side keeps inside its page runs past the end of the SWA page, and one
    SWA page can pair into two full pages."""

    def alloc_extend_swa_tail(
        self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens, swa_tail_len
    ):
        tail = int(swa_tail_len)
        if (
            not _paged_hybrid(self)
            or len(seq_lens_cpu) != 1
            or len(prefix_lens_cpu) != 1
            or not 0 < tail <= int(extend_num_tokens)
        ):
            return super().alloc_extend_swa_tail(
                prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens, swa_tail_len
            )
        PagedTokenToKVPoolAllocator.check_extend_args(
            prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens
        )
        ps = self.page_size
        n_full = get_num_new_pages(seq_lens=seq_lens_cpu, page_size=ps, prefix_lens=prefix_lens_cpu)
        n_swa = -(-tail // ps)
        if not self.new_pages_available(n_full, n_swa):
            return None
        full = self.full_attn_allocator._extend(prefix_lens, seq_lens, last_loc, extend_num_tokens, n_full)
        if full is None:
            return None
        head = int(extend_num_tokens) - tail
        self.clear_full_to_swa_mapping(full[:head])
        swa = self.swa_attn_allocator.alloc(n_swa * ps)[:tail]
        self.set_full_to_swa_mapping(full[head:], swa)
        return full


class _SeedReleasePairedPage(SWATokenToKVPoolAllocator):
    """Seed finding: the SWA release frees the whole page of every slot it is
    given, filtering only the padding 0, whatever else is still paired into
    that page. After a load-back that re-paired an evicted range starting
    inside an SWA page, evicting or dropping part of the range frees an SWA
    page that a live full slot still pairs into (the bundled impl keeps a
    reverse map to prevent it). Expected: ``pool.no_double_ownership``."""

    def _release_swa(self, swa_indices: torch.Tensor) -> None:
        if self.page_size > 1:
            swa_indices = swa_indices[swa_indices > 0]
        self.swa_attn_allocator.free(swa_indices)


class _SeedSegmentChecksLate(SWATokenToKVPoolAllocator):
    """Seed finding: hybrid ``free_segment`` runs ``free_swa`` before the full
    side's page-alignment check raises, so a refused call has already unpaired
    and released the SWA side. Expected: ``alloc.atomic``."""

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        if free_index.numel() == 0:
            return
        self.free_swa(free_index)
        self.full_attn_allocator.free_segment(free_index, start_pos=start_pos)


# --------------------------------------------------------------------------
# Extras: one variant per invariant not yet first-reported by those above.


class _FreeSwaUnguarded(SWATokenToKVPoolAllocator):
    """No ``swa.peer_mapped`` guard: at page_size 1, ``free_swa`` (and so
    ``free``) releases whatever the mapping reads, 0 included, without the
    check that the slot has a peer. Expected: ``swa.peer_mapped``."""

    def free_swa(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0 or self.page_size != 1:
            return super().free_swa(free_index)
        swa = self.full_to_swa_index_mapping[free_index]
        self.clear_full_to_swa_mapping(free_index)
        if self.free_group is not None:
            self.swa_free_group.append(swa)
            return
        self._release_swa(swa)


class _PagesAvailableOffByOne(SWATokenToKVPoolAllocator):
    """``new_pages_available`` compares with ``<`` instead of ``<=``: an extend
    or decode that needs exactly the free pages is refused. Expected:
    ``pool.capacity`` (None with enough free pages)."""

    def new_pages_available(self, num_full_pages: int, num_swa_pages: int) -> bool:
        full_ok = num_full_pages < self.full_attn_allocator.available_size() // self.page_size
        if self._swa_req_ring:
            return full_ok
        return full_ok and num_swa_pages < self.swa_attn_allocator.available_size() // self.page_size


class _ContinuationOffByOne(PagedTokenToKVPoolAllocator):
    """The paged extend layout continues a request's last page at
    ``last_loc + 2`` instead of ``last_loc + 1``: a chunked prefill from a
    prefix inside a page skips a slot. Expected: ``alloc.layout``."""

    def _extend(self, prefix_lens, seq_lens, last_loc, extend_num_tokens, num_new_pages):
        return super()._extend(prefix_lens, seq_lens, last_loc + 1, extend_num_tokens, num_new_pages)


class _SegmentDropsPartialPage(PagedTokenToKVPoolAllocator):
    """The paged ``free_segment`` takes the last slot of each page as its page
    representative (``free_index[page_size - 1 :: page_size]``): a segment
    ending inside a page never releases that page. Expected: ``pool.no_leak``."""

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        ps = self.page_size
        if ps == 1:
            return super().free_segment(free_index, start_pos=start_pos)
        _check_page_aligned(start_pos, ps)
        reps = free_index[ps - 1 :: ps]
        self.free_page_ids(reps.to(torch.int64) // ps)


class _ExtendPagesNotOffset(PagedTokenToKVPoolAllocator):
    """The extend layout indexes each request's new pages from the start of
    the batch's pages, without the per-request offset (an exclusive cumsum of
    the page counts): in a batch of several requests, all of them write into
    the first new pages. Expected: ``pool.no_double_ownership``."""

    def _extend(self, prefix_lens, seq_lens, last_loc, extend_num_tokens, num_new_pages):
        pages = self._take_pages(int(num_new_pages))
        if pages is None:
            return None
        out = [
            extend_layout(
                prefix_lens[i : i + 1], seq_lens[i : i + 1], last_loc[i : i + 1], pages, self.page_size,
                int(seq_lens[i]) - int(prefix_lens[i]),
            )
            for i in range(len(seq_lens))
        ]
        return torch.cat(out) if out else pages.new_empty((0,))


class _KvScrubNeighbour(BaseTokenToKVPoolAllocator):
    """A release that scrubs (zero-fills) the full KV of the page after each
    page it returns, as an off-by-one page clear would. Ownership bookkeeping
    stays exact, so no census notices; a live request on that page has lost
    its KV, which only the harness's tags see. Expected: ``kv.integrity``."""

    def _stage(self, page_ids: torch.Tensor) -> None:
        super()._stage(page_ids)
        buf = self._scrub_buf
        ps = self.page_size
        nxt = page_ids.to(torch.int64) + 1
        slots = (nxt[:, None] * ps + torch.arange(ps, device=nxt.device)[None, :]).reshape(-1)
        buf[slots[slots < buf.numel()]] = 0


def _init_scrub(a) -> None:
    a.full_attn_allocator._scrub_buf = a.get_kvcache().full_kv_pool.kv_buffer


# --------------------------------------------------------------------------
# A scheduler's workload (SPEC 4.1): one variant per area a reviewer of a change to
# batching, retract/resume, cache frees, scale, entry points, result types, the KV
# pool's view and long requests would fear. Each is shown real, call by call, by
# tests/test_new_variants_real.py.


def _batch_pages(pages: torch.Tensor, first: int, count: int) -> torch.Tensor:
    """pages[first : first + count], indices past the end clamped onto the last page
    (what a kernel's gather does with an index it never bounds-checks)."""
    if count <= 0 or pages.numel() == 0:
        return pages[:0]
    nth = torch.arange(first, first + count, device=pages.device).clamp_(max=pages.numel() - 1)
    return pages[nth]


class _MixedBatchPagesByExtend(PagedTokenToKVPoolAllocator):
    """Mixed prefill batch. The extend layout offsets each request's new pages by
    ``ceil(extend / page_size)`` per earlier request instead of ``ceil(seq / ps) -
    ceil(prefix / ps)``. That is the same for a request from an aligned prefix, and
    one page too many for a continuation from an unaligned prefix whose extend first
    fills the partial page and then spills onto new ones (prefix 2, seq 7, ps 4).
    Every request after such a one in the batch starts a page late, the last runs off
    the batch's pages onto the last page again, and one page the batch took is never
    handed out. Expected: ``pool.no_double_ownership`` (a page given to two requests)."""

    def _extend(self, prefix_lens, seq_lens, last_loc, extend_num_tokens, num_new_pages):
        pages = self._take_pages(int(num_new_pages))
        if pages is None:
            return None
        ps, first, out = self.page_size, 0, []
        for i in range(len(seq_lens)):
            pre, seq = int(prefix_lens[i]), int(seq_lens[i])
            mine = _batch_pages(pages, first, -(-seq // ps) - -(-pre // ps))
            out.append(extend_layout(prefix_lens[i : i + 1], seq_lens[i : i + 1], last_loc[i : i + 1], mine, ps, seq - pre))
            first += -(-(seq - pre) // ps)
        return torch.cat(out) if out else pages.new_empty((0,))


class _MixedBatchContinuationsFirst(PagedTokenToKVPoolAllocator):
    """Mixed prefill batch. The extend layout assumes a batch lists its chunked
    continuations first and its new requests after them (as a scheduler that
    appends new requests would build it): the first ``k`` requests, ``k`` the number
    with a prefix, continue their last page; every later one is laid out as if it
    started on a page boundary. A continuation behind a new request in the batch
    then skips its partial page (its next positions land on a fresh page at their
    in-page offsets), needs one page more than the batch took, and the batch's last
    request runs onto the last page again. Expected: ``alloc.layout``."""

    def _extend(self, prefix_lens, seq_lens, last_loc, extend_num_tokens, num_new_pages):
        pages = self._take_pages(int(num_new_pages))
        if pages is None:
            return None
        ps, first, out = self.page_size, 0, []
        continuing = int((prefix_lens > 0).sum())
        for i in range(len(seq_lens)):
            pre, seq = int(prefix_lens[i]), int(seq_lens[i])
            if i < continuing:
                mine = _batch_pages(pages, first, -(-seq // ps) - -(-pre // ps))
                out.append(extend_layout(prefix_lens[i : i + 1], seq_lens[i : i + 1], last_loc[i : i + 1], mine, ps, seq - pre))
                first += mine.numel()
                continue
            base = pre // ps
            mine = _batch_pages(pages, first, -(-seq // ps) - base)
            pos = torch.arange(pre, seq, dtype=torch.int64, device=pages.device)
            out.append(mine[pos // ps - base] * ps + pos % ps if mine.numel() else pos[:0])
            first += -(-seq // ps) - base
        return torch.cat(out) if out else pages.new_empty((0,))


class _DecodePagesSortedOrder(PagedTokenToKVPoolAllocator):
    """Decode batch in any order. The decode layout numbers the requests that open a
    page in the order of their ``last_loc`` (sorted, so that the new pages' writes
    coalesce) but applies those numbers at the requests' batch positions without
    undoing the sort. A batch sorted by ``last_loc`` comes out right; in any other
    order two requests that open a page can get the same new page, and a page the
    batch took goes to nobody. Expected: ``pool.no_double_ownership``."""

    def _decode(self, seq_lens, last_loc, num_new_pages):
        pages = self._take_pages(num_new_pages)
        if pages is None:
            return None
        ps = self.page_size
        seq = seq_lens.to(torch.int64)
        out = last_loc.to(torch.int64) + 1
        if pages.numel() == 0:
            return out
        opens = (seq - 1) % ps == 0
        order = torch.sort(last_loc.to(torch.int64), stable=True).indices
        nth = (torch.cumsum(opens[order].to(torch.int64), 0) - 1).clamp_(0, pages.numel() - 1)
        return torch.where(opens, pages[nth] * ps, out)


class _DeferredCopy:
    """A host copy that is not taken yet: the slot ids, read from the buffer when used."""

    def __init__(self, buf: torch.Tensor, idx: torch.Tensor):
        self.buf, self.idx = buf, idx

    def numel(self) -> int:
        return self.idx.numel()

    def __getitem__(self, key) -> "_DeferredCopy":
        return _DeferredCopy(self.buf, self.idx[key.to(self.idx.device)])

    def to(self, *args, **kwargs) -> torch.Tensor:
        return self.buf[self.idx].to(*args, **kwargs)


class _CpuCopyDeferred(TagKVPool):
    """Retract and resume. ``get_cpu_copy`` defers the device-to-host transfer (to
    overlap it with compute): it returns a handle on the slots, and the KV is read
    from the buffer only when the copy is used. The scheduler frees the retracted
    request's slots right after the call; by the time it resumes, another request
    has written its KV there, and the resumed request is loaded with someone else's
    keys and values. Expected: ``kv.integrity`` (the resumed request's KV is not
    its own)."""

    def get_cpu_copy(self, indices: torch.Tensor) -> _DeferredCopy:
        return _DeferredCopy(self.kv_buffer, indices.to(torch.int64).clone())


def _kv_tag_pools(a) -> list:
    kv = a.get_kvcache()
    return [kv.full_kv_pool, kv.swa_kv_pool]


class _LoadCopySkipsSwa(SWAKVPool):
    """Retract and resume. ``load_cpu_copy`` writes the copy back into the full
    pool only: the new slots' SWA peers keep whatever their previous owner wrote, so
    the sliding-window layers of a resumed request attend to another request's
    recent tokens. The mapping and every count are right; only the KV is wrong.
    Expected: ``kv.integrity``."""

    def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None, req_pool_index=None):
        self.full_kv_pool.load_cpu_copy(kv_cache_cpu["full"], indices.to(torch.int64))


def _kv_pool(a) -> list:
    return [a.get_kvcache()]


class _FreeDedupsAdjacentOnly(PagedTokenToKVPoolAllocator):
    """Cache-style free. The paged ``free`` removes repeated pages with
    ``unique_consecutive`` (no sort) instead of ``unique``: it sees one request's
    row, whose repeats are adjacent, as the common case. A radix-cache eviction or a
    retracted batch passes the concatenated pieces of several requests, and the
    hybrid's page expansion repeats a page once per index on it, so a page can
    recur non-adjacently: it is staged twice, sits in the free list twice, and is
    later handed to two requests. Expected: ``pool.no_double_ownership``."""

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(self._copy_for_free_group(free_index))
            return
        self._stage(torch.unique_consecutive(free_index.to(torch.int64) // self.page_size))


class _FreeListNarrowed(BaseTokenToKVPoolAllocator):
    """Scale. The free list is kept as 16-bit page ids to halve its memory (pools
    are small in every test) and widened to int64 when pages are taken: past 32767
    pages an id wraps negative, so a pool of 100,000 slots at page size 1 hands out
    slot -32768 (the KV of slot ``size + page_size - 32768`` as the kernels index
    it) once it is more than a third full, or at once after a sorted merge.
    Expected: ``pool.capacity`` (a slot outside the pool), or a crash where the hybrid
    indexes its mapping with the wrapped id."""

    def clear(self) -> None:
        super().clear()
        self.free_pages = self.free_pages.to(torch.int16)

    def _take_pages(self, num_pages: int):
        out = super()._take_pages(num_pages)
        return None if out is None else out.to(torch.int64)


def _clear_rebound(a) -> None:
    # The sub-allocators built their free lists before the rebind; build them again.
    a.clear()


class _HybridMergeDropsStaged(SWATokenToKVPoolAllocator):
    """Every public method through the hybrid's own entry point. The hybrid's
    ``merge_and_sort_free`` sorts each pool's free list and resets its staging area,
    forgetting to fold the staged pages in first (the sub-allocators' own
    ``merge_and_sort_free`` is right, and that is all a harness that merges pool by
    pool ever calls). Every page freed since the last merge is lost from both pools.
    Expected: ``pool.capacity`` (available sizes drop), then ``pool.no_leak``."""

    def merge_and_sort_free(self) -> None:
        for sub in {id(s): s for s in (self.full_attn_allocator, self.swa_attn_allocator)}.values():
            sub.free_pages = torch.sort(sub.free_pages).values
            sub._staged, sub._num_staged = [], 0


class _ExtendInt32NoNewPage(PagedTokenToKVPoolAllocator):
    """Result types. An extend that needs no new page (every request continues inside
    its last page) takes a fast path that returns ``last_loc + 1 + arange`` in
    int32, "enough for any slot id"; every other branch returns int64. The values are
    right; a caller that concatenates it with an int64 row, or a kernel that reads it
    as int64, gets garbage. Expected: ``alloc.dtype``."""

    def _extend(self, prefix_lens, seq_lens, last_loc, extend_num_tokens, num_new_pages):
        out = super()._extend(prefix_lens, seq_lens, last_loc, extend_num_tokens, num_new_pages)
        if out is not None and int(num_new_pages) == 0:
            return out.to(torch.int32)
        return out


class _ClearRemakesMapping(SWATokenToKVPoolAllocator):
    """What attention reads. ``clear()`` (and so ``resize``) builds a fresh
    full-to-SWA mapping instead of zero-filling the registered one in place. The
    allocator's own tensor is right, but the KV pool still holds the old one, which
    is never written again: after the first clear every translation through the KV
    pool (what the attention kernels and the hybrid's own
    ``translate_loc_from_full_to_swa`` read) returns the pairings from before the
    clear, or 0. Expected: ``kv.resolve``; paged, an extend from a prefix continues
    the SWA row at a stale slot (``alloc.layout``)."""

    def clear(self) -> None:
        self.swa_attn_allocator.clear()
        self.full_attn_allocator.clear()
        m = self.full_to_swa_index_mapping
        self.full_to_swa_index_mapping = torch.cat([torch.zeros_like(m[:-1]), m[-1:].clone()])
        if self._swa_to_full is not None:
            self._swa_to_full.fill_(0)
        self.free_group = None
        self.swa_free_group = []


_BLOCK_TOKENS = 2048


class _ExtendBlockWraps(PagedTokenToKVPoolAllocator):
    """Requests of thousands of tokens. The extend layout is tiled in blocks of
    2048 positions per request (a kernel's fixed BLOCK), and the index of a
    position's new page is taken within its block: positions 2048 and more past a
    request's first new page land on the request's first pages again. Every request
    of a few pages is laid out right; one long prefill writes its second block over
    its first, and the pages meant for it go to nobody. Expected: ``alloc.layout``."""

    def _extend(self, prefix_lens, seq_lens, last_loc, extend_num_tokens, num_new_pages):
        pages = self._take_pages(int(num_new_pages))
        if pages is None:
            return None
        out = extend_layout(prefix_lens, seq_lens, last_loc, pages, self.page_size, extend_num_tokens)
        ps, start, first = self.page_size, 0, 0
        for i in range(len(seq_lens)):
            pre, seq = int(prefix_lens[i]), int(seq_lens[i])
            base = -(-pre // ps) * ps  # the request's first new page starts here
            pos = torch.arange(max(pre, base), seq, dtype=torch.int64, device=out.device)
            if pos.numel():
                k = ((pos - base) % _BLOCK_TOKENS) // ps
                out[start + (pos[0] - pre) : start + (seq - pre)] = pages[first + k] * ps + pos % ps
            start += seq - pre
            first += -(-seq // ps) - -(-pre // ps)
        return out


_EXPAND_LANES = 128


class _ExpandTile128(SWATokenToKVPoolAllocator):
    """Page size larger than the window, page size 256. Page expansion
    (``_expand_to_full_pages``) covers at most 128 slots per page, the lane count of
    the kernel it was written for. Up to page size 128 nothing changes; at 256 the
    upper half of each page is never unpaired by ``free_swa`` / ``free``: freed full
    slots keep peers into SWA pages, and those pages, still paired, are never
    released. Expected: ``map.live``, then ``pool.no_leak``."""

    def _expand_to_full_pages(self, indices: torch.Tensor) -> torch.Tensor:
        ps = self.page_size
        base = (indices.to(torch.int64) // ps) * ps
        offsets = torch.arange(min(ps, _EXPAND_LANES), dtype=torch.int64, device=indices.device)
        return (base[:, None] + offsets[None, :]).reshape(-1)


VARIANTS: dict[str, Factory] = {
    # SPEC 7
    "group_raw_full_first": _variant("group_raw_full_first", hybrid=_RawGroupFullFirst, setup=_init_raw_group),
    "free_swa_token_only": _variant("free_swa_token_only", hybrid=_FreeSwaTokensOnly),
    "seed_tail_zero_stale": _variant("seed_tail_zero_stale", hybrid=_TailZeroStale),
    "release_padding": _variant("release_padding", hybrid=_ReleasePadding),
    "group_holds_view": _variant("group_holds_view", pure=_GroupHoldsViewPure, subs=_both_subs, sub_mixin=_GroupHoldsView),
    "clear_wipes_sentinel": _variant("clear_wipes_sentinel", hybrid=_ClearWipesSentinel),
    "clear_leaves_group_open": _variant("clear_leaves_group_open", hybrid=_ClearLeavesGroupOpen, pure=_ClearLeavesGroupOpenPure),
    "free_full_unguarded": _variant("free_full_unguarded", hybrid=_FreeFullUnguarded),
    "expand_drops_page": _variant("expand_drops_page", hybrid=_ExpandDropsPage),
    "expand_adds_neighbour": _variant("expand_adds_neighbour", hybrid=_ExpandAddsNeighbour),
    "ring_counts_all_slots": _variant("ring_counts_all_slots", hybrid=_RingCountsAllSlots),
    "ring_cost_unrounded": _variant("ring_cost_unrounded", hybrid=_RingCostUnrounded, setup=_ring_cost_unrounded),
    # SPEC 2.9: the seed's behaviour, which the bundled impl fixes
    "seed_decode_not_atomic": _variant("seed_decode_not_atomic", hybrid=_SeedDecodeNotAtomic),
    "seed_tail_packed": _variant("seed_tail_packed", hybrid=_SeedTailPacked),
    "seed_release_paired_page": _variant("seed_release_paired_page", hybrid=_SeedReleasePairedPage),
    "seed_segment_checks_late": _variant("seed_segment_checks_late", hybrid=_SeedSegmentChecksLate),
    # one per remaining SPEC 3.3 invariant
    "free_swa_unguarded": _variant("free_swa_unguarded", hybrid=_FreeSwaUnguarded),
    "pages_available_off_by_one": _variant("pages_available_off_by_one", hybrid=_PagesAvailableOffByOne),
    "continuation_off_by_one": _variant("continuation_off_by_one", subs=_paged_subs, sub_mixin=_ContinuationOffByOne),
    "segment_drops_partial_page": _variant("segment_drops_partial_page", subs=_paged_subs, sub_mixin=_SegmentDropsPartialPage),
    "extend_pages_not_offset": _variant("extend_pages_not_offset", subs=_paged_subs, sub_mixin=_ExtendPagesNotOffset),
    "kv_scrub_neighbour": _variant("kv_scrub_neighbour", subs=_full_sub, sub_mixin=_KvScrubNeighbour, setup=_init_scrub),
    # a scheduler's workload (SPEC 4.1), one per area
    "mixed_batch_pages_by_extend": _variant("mixed_batch_pages_by_extend", subs=_paged_subs, sub_mixin=_MixedBatchPagesByExtend),
    "mixed_batch_continuations_first": _variant("mixed_batch_continuations_first", subs=_paged_subs, sub_mixin=_MixedBatchContinuationsFirst),
    "decode_pages_sorted_order": _variant("decode_pages_sorted_order", subs=_paged_subs, sub_mixin=_DecodePagesSortedOrder),
    "cpu_copy_deferred": _variant("cpu_copy_deferred", subs=_kv_tag_pools, sub_mixin=_CpuCopyDeferred),
    "load_copy_skips_swa": _variant("load_copy_skips_swa", subs=_kv_pool, sub_mixin=_LoadCopySkipsSwa),
    "free_dedups_adjacent_only": _variant("free_dedups_adjacent_only", subs=_paged_subs, sub_mixin=_FreeDedupsAdjacentOnly),
    "free_list_narrowed": _variant("free_list_narrowed", subs=_both_subs, sub_mixin=_FreeListNarrowed, setup=_clear_rebound),
    "hybrid_merge_drops_staged": _variant("hybrid_merge_drops_staged", hybrid=_HybridMergeDropsStaged),
    "extend_int32_no_new_page": _variant("extend_int32_no_new_page", subs=_paged_subs, sub_mixin=_ExtendInt32NoNewPage),
    "clear_remakes_mapping": _variant("clear_remakes_mapping", hybrid=_ClearRemakesMapping),
    "extend_block_wraps": _variant("extend_block_wraps", subs=_paged_subs, sub_mixin=_ExtendBlockWraps),
    "expand_tile_128": _variant("expand_tile_128", hybrid=_ExpandTile128),
}

# The variants written for the scheduler-shaped workload (SPEC 4.1), one per area a
# careful reviewer of such a change would fear; tests/test_new_variants_real.py shows
# each one real by hand, without the harness.
SCHEDULER_WORKLOAD: frozenset[str] = frozenset({
    "mixed_batch_pages_by_extend",
    "mixed_batch_continuations_first",
    "decode_pages_sorted_order",
    "cpu_copy_deferred",
    "load_copy_skips_swa",
    "free_dedups_adjacent_only",
    "free_list_narrowed",
    "hybrid_merge_drops_staged",
    "extend_int32_no_new_page",
    "clear_remakes_mapping",
    "extend_block_wraps",
    "expand_tile_128",
})

# The invariants the machine's first failure may name on each variant, the one its
# docstring describes first. A bug has several symptoms; which one a run meets
# first depends on the workload drawn (all seen in runs of the CI profile's budget
# with random seeds).
EXPECTED: dict[str, tuple[str, ...]] = {
    # Its free reaches the SWA side's guard before the debug refusal of a bad free.
    "group_raw_full_first": ("map.live", "alloc.atomic", "group.deferred", "swa.peer_mapped"),
    # pool.no_leak: a later segment finish of the page's other tokens meets the stale peers
    # pool.no_double_ownership: the freed SWA page is in the free list while the full
    # page's other tokens still pair into it, free and owned at once
    "free_swa_token_only": ("map.live", "pool.no_leak", "pool.no_double_ownership"),
    "seed_tail_zero_stale": ("map.live",),
    "release_padding": ("pool.padding_reserved", "crash"),  # crash: the allocator's own capacity assert trips first
    # crash: the flush's own assert; alloc.layout: the flush freed slot 0 once for each
    # zeroed entry of the row, and the next alloc hands those copies out together
    "group_holds_view": ("pool.padding_reserved", "group.deferred", "crash", "alloc.layout"),
    "clear_wipes_sentinel": ("map.sentinel",),
    "clear_leaves_group_open": ("group.deferred",),
    "free_full_unguarded": ("swa.peer_released",),
    # crash: a segment free inside one partial page expands to no page at all, and the
    # allocator's own check that the segment's full and SWA pages agree trips first
    "expand_drops_page": ("pool.no_leak", "map.live", "swa.peer_released", "crash"),
    # swa.peer_mapped: a legal segment free meets the neighbour slot whose peer was taken;
    # crash: in debug mode the allocator's own check that the segment's full and SWA
    # pages agree sees the neighbour's page first (a segment free of a request that
    # ends where the next one's page begins)
    "expand_adds_neighbour": ("map.sentinel", "pool.no_double_ownership", "map.live", "swa.peer_mapped", "crash"),
    # group.deferred: the over-credited size seen inside an open group (more than the model there)
    "ring_counts_all_slots": ("pool.capacity", "alloc.atomic", "group.deferred"),
    "ring_cost_unrounded": ("pool.capacity",),
    "seed_decode_not_atomic": ("alloc.atomic",),
    # pool.capacity: packed, a tail takes ceil(tail / page) SWA pages, fewer than the
    # pages its in-page offsets span, so it succeeds where the SWA pool is short
    "seed_tail_packed": ("alloc.layout", "pool.capacity"),
    "seed_release_paired_page": ("pool.no_double_ownership",),
    "seed_segment_checks_late": ("alloc.atomic",),
    "free_swa_unguarded": ("swa.peer_mapped",),
    "pages_available_off_by_one": ("pool.capacity",),
    "continuation_off_by_one": ("alloc.layout", "crash"),
    "segment_drops_partial_page": ("pool.no_leak", "group.deferred"),
    "extend_pages_not_offset": ("pool.no_double_ownership",),
    "kv_scrub_neighbour": ("kv.integrity",),
    "mixed_batch_pages_by_extend": ("pool.no_double_ownership", "alloc.layout", "pool.no_leak"),
    "mixed_batch_continuations_first": ("alloc.layout", "pool.no_double_ownership"),
    "decode_pages_sorted_order": ("pool.no_double_ownership", "alloc.layout"),
    "cpu_copy_deferred": ("kv.integrity", "kv.resolve"),
    "load_copy_skips_swa": ("kv.integrity", "kv.resolve"),
    # The impl's own capacity assert may stop the double free first.
    # A double free of non-adjacent repeats is not refused: the refused break changes state.
    "free_dedups_adjacent_only": ("pool.no_double_ownership", "crash", "alloc.atomic", "contract.free.double"),
    # A wrapped id handed out by a batch is first seen as a slot no free page holds;
    # crash: a first batch that takes past page 32767 at once makes the hybrid index its
    # mapping with the wrapped id, and torch refuses it (index -32768 out of bounds)
    "free_list_narrowed": ("pool.capacity", "pool.no_double_ownership", "pool.padding_reserved", "alloc.layout", "crash"),
    "hybrid_merge_drops_staged": ("pool.capacity", "pool.no_leak", "group.deferred"),
    "extend_int32_no_new_page": ("alloc.dtype",),
    "clear_remakes_mapping": ("kv.resolve", "alloc.layout", "pool.no_double_ownership"),
    "extend_block_wraps": ("alloc.layout", "pool.no_double_ownership", "crash"),
    "expand_tile_128": ("map.live", "pool.no_leak", "swa.peer_released"),
}
