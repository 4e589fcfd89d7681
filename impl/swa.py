"""Hybrid sliding-window-attention allocator.

Two pools: a full one (every token of every request) and an SWA one (only
the recent window). ``full_to_swa_index_mapping[f]`` is the SWA peer of full
slot ``f``, 0 meaning unpaired. One extra entry at the end holds -1: requests
without a prefix pass last_loc = -1, and the lookup must hand the SWA side
that same "nothing before me" marker.

Invariants checked here:
- ``swa.peer_mapped`` (FATAL_UNCONTAINABLE): at page_size 1 the SWA slots to
  release are read straight out of the mapping. Reading 0 there means the
  padding slot would join the SWA free list, and two requests would later
  share it: pool-wide corruption.
- ``swa.peer_released`` (GUARD): ``free_full`` does not look at the SWA side;
  a slot freed while still paired leaves its SWA slot owned by nobody.

Contract breaks by the caller that cannot be allowed to corrupt state are
refused with ValueError (RuntimeError for a nested free group), always before
anything is changed.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from impl.backend import get_backend
from impl.base import BaseTokenToKVPoolAllocator, _check_page_aligned
from impl.invariants import Bucket, Invariant, IsTrue, expect
from impl.paged import (
    PagedTokenToKVPoolAllocator,
    _HOST_LIST_MAX,
    _as_i64,
    decode_layout,
    extend_layout,
    page_of,
)
from impl.token import TokenToKVPoolAllocator

logger = logging.getLogger(__name__)

SWA_PEER_MAPPED = Invariant("swa.peer_mapped", Bucket.FATAL_UNCONTAINABLE, IsTrue())
SWA_PEER_RELEASED = Invariant("swa.peer_released", Bucket.GUARD, IsTrue())


def _require_kvcache(kvcache) -> None:
    for attr in ("register_mapping", "translate_loc_from_full_to_swa", "swa_kv_pool"):
        if not hasattr(kvcache, attr):
            raise TypeError(
                f"kvcache {type(kvcache).__name__} lacks {attr!r}; pass an SWA KV "
                "pool (impl.kv_pool.SWAKVPool)"
            )


class SWATokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """Full and SWA allocators side by side, joined by the full->SWA mapping."""

    # Defaults on the class: is_swa_req_ring must work on subclasses whose
    # own __init__ never runs this one (the pure-SWA allocator, for one).
    _swa_req_ring = False
    _swa_ring_cost = 0
    _req_to_token_pool = None
    _swa_to_full = None
    layout = "torch"

    def __init__(
        self,
        size: int,
        size_swa: int,
        page_size: int,
        dtype: torch.dtype,
        device,
        kvcache,
        need_sort: bool,
        req_to_token_pool=None,
        *,
        backend: str = "auto",
        layout: str = "torch",
    ):
        _require_kvcache(kvcache)
        ring_size = getattr(kvcache, "swa_req_ring_size", None)
        if ring_size is not None:
            if page_size == 1:
                # The ring accounting counts request slots, yet a page_size-1
                # alloc pairs every token with an SWA slot of the token pool:
                # available_size() would promise what alloc() cannot give.
                raise NotImplementedError(
                    "per-request SWA ring needs page_size > 1; build without "
                    "swa_req_ring_size or with a paged pool"
                )
            if req_to_token_pool is None:
                raise ValueError(
                    "per-request SWA ring: SWA capacity is counted in request "
                    "slots, so pass req_to_token_pool"
                )

        self._size_full = size
        self._size_swa = size_swa
        self.dtype = dtype
        self.device = device
        self.page_size = page_size
        self.need_sort = need_sort
        self._backend = get_backend(backend, device)

        full_kv_pool = getattr(kvcache, "full_kv_pool", None)
        swa_kv_pool = getattr(kvcache, "swa_kv_pool", None)
        if page_size == 1:
            self.full_attn_allocator = TokenToKVPoolAllocator(
                size, dtype, device, full_kv_pool, need_sort
            )
            self.swa_attn_allocator = TokenToKVPoolAllocator(
                size_swa, dtype, device, swa_kv_pool, need_sort
            )
        else:
            self.full_attn_allocator = PagedTokenToKVPoolAllocator(
                size, page_size, dtype, device, full_kv_pool, need_sort, layout=layout
            )
            self.swa_attn_allocator = PagedTokenToKVPoolAllocator(
                size_swa, page_size, dtype, device, swa_kv_pool, need_sort, layout=layout
            )
        self.layout = layout

        # size + page_size entries reach the last slot of the last page; the
        # extra final entry is the -1 sentinel (see the module docstring).
        self.full_to_swa_index_mapping = torch.cat(
            [
                torch.zeros(size + page_size, dtype=torch.int64, device=device),
                torch.full((1,), -1, dtype=torch.int64, device=device),
            ]
        )

        # Reverse of the mapping, paged only: which full slot each SWA slot is
        # paired with (0: none). A re-pair may put one SWA page under two full
        # pages, so releasing a page must first see that no slot on it is
        # still paired. Writes are idempotent, so repeated indices are safe.
        self._swa_to_full = (
            torch.zeros(size_swa + page_size, dtype=torch.int64, device=device)
            if page_size > 1
            else None
        )

        self.free_pages = None
        self._staged, self._num_staged = [], 0
        self.free_group = None
        self.swa_free_group: list[torch.Tensor] = []
        # SWA page ids free_swa_segment resolved inside an open group.
        self.swa_page_ids_group: list[torch.Tensor] = []
        self._kvcache = kvcache

        self._swa_req_ring = ring_size is not None
        self._req_to_token_pool = req_to_token_pool
        if self._swa_req_ring:
            # Each request slot owns a ring rounded up to whole pages; all
            # request slots are free now, so this is the full SWA capacity.
            self._swa_ring_cost = _ceil_to(ring_size, page_size)
            self._size_swa = req_to_token_pool.available_size() * self._swa_ring_cost
            logger.info(
                "SWA ring accounting: ring_size=%s cost=%s tokens, size_swa=%s "
                "(the paged size_swa=%s is not used)",
                ring_size,
                self._swa_ring_cost,
                self._size_swa,
                size_swa,
            )
        else:
            self._swa_ring_cost = 0

        self.clear()
        self._kvcache.register_mapping(self.full_to_swa_index_mapping)

    # ------------------------------------------------------------ debug

    @property
    def debug_mode(self) -> bool:
        """The sub-allocators hold the debug switch, as in sglang, where the
        hybrid reads ``swa_attn_allocator.debug_mode``; setting it here sets both."""
        return self.swa_attn_allocator.debug_mode

    @debug_mode.setter
    def debug_mode(self, value: bool) -> None:
        self.full_attn_allocator.debug_mode = bool(value)
        self.swa_attn_allocator.debug_mode = bool(value)

    # ------------------------------------------------------------ ring

    @property
    def swa_req_ring(self) -> bool:
        return self._swa_req_ring

    @property
    def swa_ring_cost_tokens(self) -> int:
        return self._swa_ring_cost

    # ------------------------------------------------------------ sizes

    def available_size(self) -> int:
        if self._swa_req_ring:
            # Each admitted request already holds its whole ring, and decode
            # writes around it; new tokens cost full-pool slots only.
            return self.full_attn_allocator.available_size()
        return min(
            self.full_attn_allocator.available_size(),
            self.swa_attn_allocator.available_size(),
        )

    def full_available_size(self) -> int:
        return self.full_attn_allocator.available_size()

    def swa_available_size(self) -> int:
        if self._swa_req_ring:
            return self._req_to_token_pool.available_size() * self._swa_ring_cost
        return self.swa_attn_allocator.available_size()

    def _conserve_full_available_size(self) -> int:
        return self.full_available_size()

    def _conserve_swa_available_size(self) -> int:
        return self.swa_available_size()

    @property
    def size(self) -> int:
        return min(self._size_full, self._size_swa)

    @property
    def size_swa(self) -> int:
        return self._size_swa

    @property
    def size_full(self) -> int:
        return self._size_full

    def debug_print(self) -> str:
        return (
            f"#swa-available-size: {self.swa_available_size()}, "
            f"#full-attn-available-size: {self.full_attn_allocator.available_size()}, "
        )

    def get_all_free_pages(self):
        # Two pools: ask full_attn_allocator / swa_attn_allocator instead.
        return None

    def merge_and_sort_free(self) -> None:
        self.full_attn_allocator.merge_and_sort_free()
        self.swa_attn_allocator.merge_and_sort_free()

    # ------------------------------------------------------------ mapping

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        return self._kvcache.translate_loc_from_full_to_swa(kv_indices)

    def translate_swa_indices_for_transfer(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """Full slot ids to the SWA slots a KV transfer moves for them."""
        return self.translate_loc_from_full_to_swa(kv_indices)

    def set_full_to_swa_mapping(self, full_indices: torch.Tensor, swa_indices: torch.Tensor) -> None:
        if full_indices.numel() == 0:
            return
        if full_indices.numel() != swa_indices.numel():
            raise ValueError(
                f"set_full_to_swa_mapping: {full_indices.numel()} full indices but "
                f"{swa_indices.numel()} SWA indices; pass one SWA slot per full slot"
            )
        full_indices = _as_i64(full_indices)
        if swa_indices.dtype is not self.full_to_swa_index_mapping.dtype:
            swa_indices = swa_indices.to(self.full_to_swa_index_mapping.dtype)
        self._unlink_reverse(full_indices)
        self._backend.scatter(self.full_to_swa_index_mapping, full_indices, swa_indices)
        if self._swa_to_full is not None:
            self._backend.scatter(self._swa_to_full, swa_indices, full_indices)

    def clear_full_to_swa_mapping(self, full_indices: torch.Tensor) -> None:
        if full_indices.numel() == 0:
            return
        full_indices = _as_i64(full_indices)
        self._unlink_reverse(full_indices)
        self._backend.zero_fill(self.full_to_swa_index_mapping, full_indices)

    def _clear_read_mapping(self, full_indices: torch.Tensor, peers: torch.Tensor) -> None:
        """``clear_full_to_swa_mapping`` where the caller has just read these
        entries (``peers``): the reverse map is unlinked from them, not from a
        second read of the same entries."""
        if self._swa_to_full is not None:
            self._backend.zero_fill(self._swa_to_full, peers)
        self._backend.zero_fill(self.full_to_swa_index_mapping, full_indices)

    def _unlink_reverse(self, full_indices: torch.Tensor) -> None:
        """The SWA slots these entries point at lose their pairing (0 points at padding)."""
        if self._swa_to_full is not None:
            self._backend.zero_fill(
                self._swa_to_full, self._backend.gather(self.full_to_swa_index_mapping, full_indices)
            )

    # ------------------------------------------------------------ contract checks

    def _require_paged(self, call: str) -> None:
        if self.page_size == 1:
            raise ValueError(
                f"{call} is a paged call but this allocator has page_size=1; "
                "use alloc(n) instead"
            )

    # ------------------------------------------------------------ alloc

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        if self.page_size != 1:
            raise ValueError(
                f"alloc(need_size) is for page_size=1 but this allocator has "
                f"page_size={self.page_size}; use alloc_extend / alloc_decode"
            )
        if need_size < 0:
            raise ValueError(f"alloc: need_size={need_size} is negative")
        # Check both sides first, so a short SWA pool leaves the full one alone.
        if need_size > self.full_attn_allocator.available_size():
            return None
        if need_size > self.swa_attn_allocator.available_size():
            return None
        full = self.full_attn_allocator.alloc(need_size)
        swa = self.swa_attn_allocator.alloc(need_size)
        assert full is not None and swa is not None
        self.set_full_to_swa_mapping(full, swa)
        return full

    def new_pages_available(self, num_full_pages: int, num_swa_pages: int) -> bool:
        full_ok = num_full_pages <= self.full_attn_allocator.available_size() // self.page_size
        if self._swa_req_ring:
            return full_ok
        return full_ok and (
            num_swa_pages <= self.swa_attn_allocator.available_size() // self.page_size
        )

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> Optional[torch.Tensor]:
        self._require_paged("alloc_extend")
        num_new_pages = PagedTokenToKVPoolAllocator._checked_extend_pages(
            prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens,
            self.page_size,
        )
        # Both pools need the same page count: an SWA row mirrors the full
        # row's page layout over the same positions.
        if not self.new_pages_available(num_new_pages, num_new_pages):
            return None

        if self._swa_req_ring:
            # Ring mode pages the full pool only; the mapping stays unwritten.
            return self.full_attn_allocator.alloc_extend(
                prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc,
                extend_num_tokens, num_new_pages=num_new_pages,
            )

        if self._joint_layouts("_extend"):
            pages = self._take_both(num_new_pages)
            if pages is None:
                return None
            last = _as_i64(last_loc)
            if len(prefix_lens_cpu) <= _HOST_LIST_MAX and not any(prefix_lens_cpu.tolist()):
                # No row continues a page, so the layout reads neither pool's
                # last slot: the full row's stands in for the SWA row's.
                last = last.expand(2, -1)
            else:
                # The SWA row continues its own last slot.
                last = torch.stack((last, _as_i64(self.translate_loc_from_full_to_swa(last_loc))))
            both = extend_layout(
                prefix_lens, seq_lens, last, pages, self.page_size, extend_num_tokens,
                (prefix_lens_cpu, seq_lens_cpu),
            )
            full, swa = both.unbind(0)
        else:
            # Translate before allocating: the SWA row continues its own last slot.
            swa_last_loc = self.translate_loc_from_full_to_swa(last_loc)
            full = self.full_attn_allocator._extend(
                prefix_lens, seq_lens, last_loc, extend_num_tokens, num_new_pages
            )
            if full is None:
                return None
            swa = self.swa_attn_allocator._extend(
                prefix_lens, seq_lens, swa_last_loc, extend_num_tokens, num_new_pages
            )
            assert swa is not None, "SWA pool ran short after new_pages_available said yes"
        self.set_full_to_swa_mapping(full, swa)
        return full

    def _joint_layouts(self, hook: str) -> bool:
        """Whether one layout pass may serve both pools.

        The two pools' layouts differ only in their page ids and continuation
        slots, so they are computed together, halving the tensor ops of a call.
        That holds only while both sub-allocators compute their layouts as
        ``PagedTokenToKVPoolAllocator`` does: a subclass that overrides ``hook``
        (``_extend`` or ``_decode``), another layout or debug mode's checks
        there send each pool through its own call instead.
        """
        base = getattr(PagedTokenToKVPoolAllocator, hook)
        full, swa = self.full_attn_allocator, self.swa_attn_allocator
        return (
            self.layout == "torch"
            and getattr(type(full), hook) is base
            and getattr(type(swa), hook) is base
            and not full.debug_mode
            and not swa.debug_mode
        )

    def _take_both(self, num_pages: int) -> Optional[torch.Tensor]:
        """``num_pages`` new pages off each pool, stacked (full first), or None."""
        if num_pages == 0:
            # Most decode steps open no page: nothing to slice off either list.
            return torch.empty((2, 0), dtype=torch.int64, device=self.device)
        full = self.full_attn_allocator._take_pages(int(num_pages))
        if full is None:
            return None
        swa = self.swa_attn_allocator._take_pages(int(num_pages))
        assert swa is not None, "SWA pool ran short after new_pages_available said yes"
        return torch.stack((_as_i64(full), _as_i64(swa)))

    def alloc_extend_swa_tail(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
        swa_tail_len: int,
    ) -> Optional[torch.Tensor]:
        """Full slots for the whole extend, SWA slots only for its last
        ``swa_tail_len`` tokens (the rest is already outside the window)."""
        self._require_paged("alloc_extend_swa_tail")
        if len(seq_lens_cpu) != 1 or len(prefix_lens_cpu) != 1:
            raise ValueError(
                f"alloc_extend_swa_tail supports one request per call, got a batch "
                f"of {len(seq_lens_cpu)}; call it once per request"
            )
        extend_num_tokens = int(extend_num_tokens)
        swa_tail_len = int(swa_tail_len)
        if not 0 <= swa_tail_len <= extend_num_tokens:
            raise ValueError(
                f"alloc_extend_swa_tail: swa_tail_len={swa_tail_len} must be within "
                f"0..extend_num_tokens={extend_num_tokens}; the tail is part of the extend"
            )

        num_full_pages = PagedTokenToKVPoolAllocator._checked_extend_pages(
            prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens,
            self.page_size,
        )
        ps = self.page_size
        seq_len = int(seq_lens_cpu[0])
        tail_start = seq_len - swa_tail_len
        # The tail keeps its full slots' in-page offsets, so that a later
        # extend or decode, which pages by full positions, continues the SWA
        # row inside its own page, and no SWA page pairs two full pages.
        tail_page_start = (tail_start // ps) * ps
        num_swa_pages = _ceil_div(seq_len, ps) - tail_start // ps if swa_tail_len else 0
        if not self.new_pages_available(num_full_pages, num_swa_pages):
            return None

        if self._swa_req_ring:
            return self.full_attn_allocator.alloc_extend(
                prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc,
                extend_num_tokens, num_new_pages=num_full_pages,
            )

        full = self.full_attn_allocator._extend(
            prefix_lens, seq_lens, last_loc, extend_num_tokens, num_full_pages
        )
        if full is None:
            return None

        head = extend_num_tokens - swa_tail_len
        # Recycled full pages may carry stale peers from an earlier owner; the
        # head has no SWA slot, so its entries must read 0 -- for a tail of 0
        # as well, where the whole extend is head.
        self.clear_full_to_swa_mapping(full[:head])
        if swa_tail_len == 0:
            return full

        dev = self.device
        # Fresh SWA pages laid out from the tail's first page boundary; the
        # slots before the tail on that page stay unpaired.
        swa = self.swa_attn_allocator._extend(
            torch.full((1,), tail_page_start, dtype=torch.int64, device=dev),
            torch.full((1,), seq_len, dtype=torch.int64, device=dev),
            torch.full((1,), -1, dtype=torch.int64, device=dev),
            seq_len - tail_page_start,
            num_swa_pages,
        )
        assert swa is not None, "SWA pool ran short after new_pages_available said yes"
        self.set_full_to_swa_mapping(full[head:], swa[tail_start - tail_page_start :])
        return full

    def alloc_decode(
        self,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
    ) -> Optional[torch.Tensor]:
        self._require_paged("alloc_decode")
        num_new_pages = PagedTokenToKVPoolAllocator._checked_decode_pages(
            seq_lens, seq_lens_cpu, last_loc, self.page_size
        )
        if self._swa_req_ring:
            return self.full_attn_allocator.alloc_decode(seq_lens, seq_lens_cpu, last_loc)

        # Checked up front so that a short SWA pool cannot leave the full
        # side's pages taken with nothing returned.
        if not self.new_pages_available(num_new_pages, num_new_pages):
            return None
        swa_last_loc = self.translate_loc_from_full_to_swa(last_loc)
        if num_new_pages == 0 and self._joint_layouts("_decode"):
            # Most decode steps open no page: every row goes on at last_loc + 1
            # (decode_layout without pages), and two adds cost less than
            # stacking the pools for one.
            full, swa = _as_i64(last_loc) + 1, _as_i64(swa_last_loc) + 1
        elif self._joint_layouts("_decode"):
            pages = self._take_both(num_new_pages)
            if pages is None:
                return None
            both = decode_layout(
                seq_lens, torch.stack((_as_i64(last_loc), _as_i64(swa_last_loc))),
                pages, self.page_size,
            )
            full, swa = both.unbind(0)
        else:
            full = self.full_attn_allocator._decode(seq_lens, last_loc, num_new_pages)
            if full is None:
                return None
            swa = self.swa_attn_allocator._decode(seq_lens, swa_last_loc, num_new_pages)
            assert full is not None and swa is not None
        self.set_full_to_swa_mapping(full, swa)
        return full

    # ------------------------------------------------------------ free

    def free(self, free_index: torch.Tensor) -> None:
        """Release full slots and their SWA peers. Calling it twice on the
        same slots is a double free.

        The SWA half runs first because it is the half that consults the
        mapping; inside a group, a load-back after this call may rewrite
        those entries, and the peers to release are the ones paired now.
        """
        if free_index.numel() == 0:
            return
        cls = type(self)
        if not (
            cls.free_swa is SWATokenToKVPoolAllocator.free_swa
            and cls.free_full is SWATokenToKVPoolAllocator.free_full
            and cls._expand_to_full_pages is SWATokenToKVPoolAllocator._expand_to_full_pages
        ):
            self.free_swa(free_index)
            self.free_full(free_index)
            return
        # This class's free_swa zeroes the mapping of every page free_index
        # touches, so free_full's swa.peer_released check cannot fail after it;
        # a subclass that changes either half keeps the check (above).
        full = self.full_attn_allocator
        if self._frees_whole_pages():
            # Both halves need the touched full pages, each once: one unique
            # serves both, and the SWA half reads one mapping row a page
            # instead of one a freed index.
            pages = torch.unique(self._page_of(_as_i64(free_index)))
            self._release_swa(self._take_peer_rows(pages))
            full._release_pages(pages)
        else:
            self.free_swa(free_index)
            full.free(free_index)
        assert full.available_size() <= full.size

    def _frees_whole_pages(self) -> bool:
        """Whether free() may hand both halves the deduplicated full pages: paged,
        the torch layout, no free group open (a group dedups across its calls,
        so it must hold the freed slots), and a full sub-allocator whose free is
        PagedTokenToKVPoolAllocator's (freeing slots = free_page_ids of their
        pages, each once)."""
        full = type(self.full_attn_allocator)
        return (
            self.page_size > 1
            and self.layout == "torch"
            and self.free_group is None
            and full.free is PagedTokenToKVPoolAllocator.free
            and full.free_page_ids is PagedTokenToKVPoolAllocator.free_page_ids
        )

    def free_swa(self, free_index: torch.Tensor) -> None:
        """Release the SWA peers of ``free_index`` (whole pages when paged) and
        unpair them; the full slots stay."""
        if free_index.numel() == 0:
            return
        if self.page_size == 1:
            # Dropping unpaired entries here would need a boolean mask, whose
            # result size the host must read back; the check reports them.
            swa = self.full_to_swa_index_mapping[free_index]
            expect(SWA_PEER_MAPPED, swa > 0, msg="slot has no SWA peer; the caller wants free_full")
            self.clear_full_to_swa_mapping(free_index)
        elif self.layout == "triton":
            swa = self._gather_and_clear(free_index)
            # The reverse map loses the SWA slots read, as _unlink_reverse does
            # on the torch path.
            self._backend.zero_fill(self._swa_to_full, swa)
        elif type(self)._expand_to_full_pages is SWATokenToKVPoolAllocator._expand_to_full_pages:
            # The expansion's slots are whole pages, so the mapping is read and
            # cleared as rows of a (page, offset) view: one row copy per index
            # in place of building every slot id. Same entries, same order.
            swa = self._take_peer_rows(self._page_of(_as_i64(free_index)))
        else:
            where = self._expand_to_full_pages(free_index)
            swa = self.full_to_swa_index_mapping[where]
            self._clear_read_mapping(where, swa)

        if self.free_group is not None:
            # Hold the SWA ids as read now, not the full ids: before the group
            # ends, a load-back may give these full slots new peers, and those
            # must survive the flush.
            self.swa_free_group.append(swa)
            return
        self._release_swa(swa)

    def _take_peer_rows(self, pages: torch.Tensor) -> torch.Tensor:
        """The mapping rows of these full pages, flat (a page named twice is
        read twice), then zeroed, with the reverse map's entries for them."""
        rows = self._page_rows(self.full_to_swa_index_mapping)
        swa = self._backend.gather(rows, pages).reshape(-1)
        if self._swa_to_full is not None:
            self._backend.zero_fill(self._swa_to_full, swa)
        self._backend.zero_fill(rows, pages)
        return swa

    def free_swa_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """``free_swa`` for positions start_pos.. of one request (sglang 0.5.23).

        One representative per page, ``free_index[::page_size]``: each one's
        peer page is released whole, and the mapping of the representative's
        whole full page is cleared. That needs no unique and no mask, so the
        shapes are known in advance. The caller's side: start_pos is
        page-aligned; every representative has a peer (``swa.peer_mapped``
        otherwise); the full and SWA pages are paired in step, i.e. each full
        page's peers lie on its representative's peer page and that SWA page
        pairs with no other full page (debug mode checks the first half).
        Inside a free group the SWA pages are resolved now and held. A no-op
        in ring mode, whose SWA side is not paged.
        """
        _check_page_aligned(start_pos, self.page_size)
        if self._swa_req_ring or free_index.numel() == 0:
            return
        ps = self.page_size
        reps = free_index[::ps].to(torch.int64)
        swa = self.full_to_swa_index_mapping[reps]
        expect(SWA_PEER_MAPPED, swa > 0, msg="page representative has no SWA peer; the caller wants free_full")
        if ps == 1:
            where, swa_pages = reps, swa
        else:
            where = self._expand_to_full_pages(reps)
            swa_pages = swa // ps
            if self.swa_attn_allocator.debug_mode:
                self._debug_check_segment_pages(where, swa_pages)
        self.clear_full_to_swa_mapping(where)
        if self.free_group is not None:
            self.swa_page_ids_group.append(swa_pages)
            return
        self.swa_attn_allocator.free_page_ids(swa_pages)

    def _debug_check_segment_pages(self, where: torch.Tensor, swa_pages: torch.Tensor) -> None:
        """The representatives' SWA pages are exactly the pages the segment's
        full pages map into, each once (sglang's check; a dead representative
        gives page 0 and fails it)."""
        ref = self.full_to_swa_index_mapping[where].cpu()
        got = torch.sort(swa_pages.cpu()).values
        want = torch.unique(ref[ref > 0] // self.page_size)
        assert torch.equal(got, want), (
            f"free_swa_segment: representatives' SWA pages {got.tolist()[:8]} differ from "
            f"the pages the segment's full pages map into {want.tolist()[:8]} (a "
            "representative with no peer, or full and SWA pages not paired in step)"
        )

    def _gather_and_clear(self, free_index: torch.Tensor) -> torch.Tensor:
        """The triton layout's free_swa read: the mapping entries of every page
        ``free_index`` touches (a page touched twice read twice), then zeroed."""
        from impl.triton_layout import gather_and_clear_pages

        return gather_and_clear_pages(free_index, self.full_to_swa_index_mapping, self.page_size)

    def _release_swa(self, swa_indices: torch.Tensor) -> None:
        ps = self.page_size
        if ps == 1:
            self.swa_attn_allocator.free(swa_indices)
        else:
            # Whole-page expansion also reads slots that were never paired
            # (e.g. a load-back whose SWA chunk began mid-page); their 0 must
            # not reach the free list. And a page another full page still
            # pairs into stays owned: it goes when its last pair does.
            # Each page is looked at once (one unique and one mask, so host syncs,
            # per release): the expansion repeats a page for every index on it,
            # and a check per repeat would cost page_size squared a page.
            # An unpaired 0 lands on page 0 (and a broken expansion's read of the
            # sentinel on page -1); the last mask drops those with the pages still
            # paired, and what is left is distinct, so it goes back as page ids.
            pages = self._page_of(swa_indices)
            n = pages.shape[0]
            if n < _MARK_DEDUP_MIN:
                pages = torch.unique(pages)
            else:
                # Dedup by marking instead of sorting all n: each entry writes its
                # position into a per-page scratch slot, exactly one position per
                # page survives the writes, and only those entries, one per page,
                # are sorted. About 2.7x faster than unique at 40,960 entries;
                # below a few thousand unique is the faster. Pages below 1 are
                # dropped anyway, so they may share page 0's slot.
                pages = pages.clamp(min=0)
                marks = self._page_marks()
                order = torch.arange(n, device=pages.device)
                self._backend.scatter(marks, pages, order)
                pages = torch.sort(pages[self._backend.gather(marks, pages) == order]).values
            # Plain indexing: page -1 (see above) must wrap, not raise. A page
            # still paired is set to 0 in place (pages is this call's own), so
            # one test drops it with page 0 and -1.
            still_paired = self._page_rows(self._swa_to_full)[pages].any(dim=1)
            pages = pages.masked_fill_(still_paired, 0)
            _release_page_ids(self.swa_attn_allocator, pages[pages > 0])
        assert self.swa_attn_allocator.available_size() <= self.swa_attn_allocator.size

    def _page_marks(self) -> torch.Tensor:
        """One scratch slot per SWA page for the release's dedup, made once and
        never cleared: each use writes every slot it then reads."""
        marks = self.__dict__.get("_marks")
        if marks is None:
            marks = torch.zeros(
                self._swa_to_full.shape[0] // self.page_size, dtype=torch.int64, device=self.device
            )
            self._marks = marks
        return marks

    def _page_rows(self, table: torch.Tensor) -> torch.Tensor:
        """``table`` (indexed by slot, page 0 first) as a (page, offset) view of
        its first whole pages, which hold every page a pool hands out.

        The view is made once per table (two tensor ops on every free
        otherwise); a table put in another's place gets its own."""
        views = self.__dict__.setdefault("_row_views", {})
        held = views.get(id(table))
        if held is None or held[0] is not table:
            if len(views) > 4:
                views.clear()
            ps = self.page_size
            held = views[id(table)] = (table, table[: table.shape[0] // ps * ps].view(-1, ps))
        return held[1]

    def _page_of(self, slots: torch.Tensor) -> torch.Tensor:
        return page_of(slots, self.page_size)

    def _offsets(self) -> torch.Tensor:
        """0 .. page_size - 1, made once (the page expansions' in-page offsets)."""
        offsets = self.__dict__.get("_page_offsets")
        if offsets is None:
            offsets = torch.arange(self.page_size, dtype=torch.int64, device=self.device)
            self._page_offsets = offsets
        return offsets

    def free_full(self, free_index: torch.Tensor) -> None:
        """Release full slots whose SWA peers the caller already released."""
        if free_index.numel() == 0:
            return
        # Checked against the mapping as it is now. Within a group, a later
        # load-back may legally pair the slot again before the flush; that is
        # not an error of this call.
        expect(
            SWA_PEER_RELEASED,
            self.full_to_swa_index_mapping[free_index] == 0,
            msg="slot still has an SWA peer; the caller wants free",
        )
        self.full_attn_allocator.free(free_index)
        assert self.full_attn_allocator.available_size() <= self.full_attn_allocator.size

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        _check_page_aligned(start_pos, self.page_size)
        if free_index.numel() == 0:
            return
        # Mapping reads before anything else, for the reason given in free().
        if self.layout == "triton" and self.page_size > 1:
            # The row is page-consecutive from an aligned start, so one index per
            # page (as the full half's free_segment takes) names every page.
            self.free_swa(free_index[:: self.page_size])
        else:
            self.free_swa(free_index)
        self.full_attn_allocator.free_segment(free_index, start_pos=start_pos)

    def free_full_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        _check_page_aligned(start_pos, self.page_size)
        if free_index.numel() == 0:
            return
        expect(
            SWA_PEER_RELEASED,
            self.full_to_swa_index_mapping[free_index] == 0,
            msg="segment still has SWA peers; the caller wants free_segment",
        )
        self.full_attn_allocator.free_segment(free_index, start_pos=start_pos)

    # ------------------------------------------------------------ free groups

    def free_group_begin(self) -> None:
        super().free_group_begin()
        self.swa_free_group = []
        self.swa_page_ids_group = []
        # Full-side frees are held by full_attn_allocator's own group; this
        # object keeps only the SWA ids it resolved at enqueue.
        self.full_attn_allocator.free_group_begin()

    def free_group_end(self) -> None:
        self.free_group = None
        pages, self.swa_page_ids_group = self.swa_page_ids_group, []
        if pages:
            self.swa_attn_allocator.free_page_ids(torch.cat(pages))
        held, self.swa_free_group = self.swa_free_group, []
        if held:
            self._release_swa(torch.cat(held))
        self.full_attn_allocator.free_group_end()
        assert self.full_attn_allocator.available_size() <= self.full_attn_allocator.size
        assert self.swa_attn_allocator.available_size() <= self.swa_attn_allocator.size

    def _expand_to_full_pages(self, indices: torch.Tensor) -> torch.Tensor:
        """Every slot of every page ``indices`` touches.

        Two indices on one page give that page twice. Removing the repeat
        would take a unique (unknown output size, so a host sync); the paged
        free dedups pages itself, so the repeat costs nothing downstream.
        """
        ps = self.page_size
        base = (_as_i64(indices) // ps) * ps
        expanded = (base[:, None] + self._offsets()).reshape(-1)
        if self.swa_attn_allocator.debug_mode:
            got = torch.unique(expanded.cpu() // ps)
            want = torch.unique(indices.cpu().to(torch.int64) // ps)
            assert torch.equal(got, want), "page expansion changed the page set"
        return expanded

    # ------------------------------------------------------------ lifecycle

    def resize(self, config) -> None:
        """Shrink both pools to ``config.full_max_total_num_tokens`` /
        ``config.swa_max_total_num_tokens`` and clear.

        Growth is refused: the mapping and KV buffers were sized at
        construction.
        """
        size_full = int(config.full_max_total_num_tokens)
        size_swa = int(config.swa_max_total_num_tokens)
        for key, new, built in (
            ("full_max_total_num_tokens", size_full, self.full_attn_allocator._built_capacity()),
            ("swa_max_total_num_tokens", size_swa, self.swa_attn_allocator._built_capacity()),
        ):
            if new < 0 or new > built:
                raise ValueError(
                    f"resize: {key}={new} is outside 0..{built} (the size this "
                    "allocator was built with); build a new allocator to grow"
                )
        self._size_full = size_full
        if not self._swa_req_ring:
            # In ring mode SWA capacity is request slots x ring cost, which a
            # token-count resize does not change.
            self._size_swa = size_swa
        for alloc, new in (
            (self.full_attn_allocator, size_full),
            (self.swa_attn_allocator, size_swa),
        ):
            alloc.size = new
            if self.page_size > 1:
                alloc.num_pages = new // self.page_size
        self.clear()

    def clear(self) -> None:
        self.swa_attn_allocator.clear()
        self.full_attn_allocator.clear()
        # Everything but the trailing -1 sentinel.
        self.full_to_swa_index_mapping[:-1].fill_(0)
        if self._swa_to_full is not None:
            self._swa_to_full.fill_(0)
        self.free_group = None
        self.swa_free_group = []
        self.swa_page_ids_group = []

    def get_cpu_copy(self, indices, mamba_indices=None, req_pool_index=None):
        return self._kvcache.get_cpu_copy(
            indices, mamba_indices=mamba_indices, req_pool_index=req_pool_index
        )

    def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None, req_pool_index=None):
        return self._kvcache.load_cpu_copy(
            kv_cache_cpu, indices, mamba_indices=mamba_indices, req_pool_index=req_pool_index
        )


class PureSWATokenToKVPoolAllocator(SWATokenToKVPoolAllocator):
    """One pool for models whose every layer is sliding-window attention.

    The mapping is the identity (never rewritten) and page_size is 1.
    """

    def __init__(
        self,
        size_swa: int,
        page_size: int,
        dtype: torch.dtype,
        device,
        kvcache,
        need_sort: bool,
        *,
        backend: str = "auto",
    ):
        if page_size != 1:
            raise NotImplementedError(
                f"PureSWATokenToKVPoolAllocator supports page_size 1 only, got {page_size}"
            )
        _require_kvcache(kvcache)
        self.page_size = page_size
        self.dtype = dtype
        self.device = device
        self.need_sort = need_sort
        self._backend = get_backend(backend, device)
        self._size_full = self._size_swa = size_swa

        self.swa_attn_allocator = TokenToKVPoolAllocator(
            size_swa, dtype, device, kvcache.swa_kv_pool, need_sort
        )
        self.full_attn_allocator = self.swa_attn_allocator

        self.full_to_swa_index_mapping = torch.cat(
            [
                torch.arange(size_swa + page_size, dtype=torch.int64, device=device),
                torch.full((1,), -1, dtype=torch.int64, device=device),
            ]
        )
        self.free_pages = None
        self._staged, self._num_staged = [], 0
        self.free_group = None
        self.swa_free_group = []
        self._kvcache = kvcache
        self.swa_attn_allocator.clear()
        self._kvcache.register_mapping(self.full_to_swa_index_mapping)

    def available_size(self) -> int:
        return self.swa_attn_allocator.available_size()

    def full_available_size(self) -> int:
        return self.swa_attn_allocator.available_size()

    def swa_available_size(self) -> int:
        return self.swa_attn_allocator.available_size()

    def new_pages_available(self, num_full_pages: int, num_swa_pages: int) -> bool:
        avail = self.swa_attn_allocator.available_size() // self.page_size
        return num_full_pages <= avail and num_swa_pages <= avail

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        return kv_indices

    def set_full_to_swa_mapping(self, full_indices, swa_indices) -> None:
        # The identity table doubles as the attention kernels' address map
        # (registered with the KV pool); there is no second pool to point into.
        raise NotImplementedError("PureSWATokenToKVPoolAllocator has no full->SWA mapping to rewrite")

    def clear_full_to_swa_mapping(self, full_indices) -> None:
        raise NotImplementedError("PureSWATokenToKVPoolAllocator has no full->SWA mapping to clear")

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        if need_size < 0:
            raise ValueError(f"alloc: need_size={need_size} is negative")
        return self.swa_attn_allocator.alloc(need_size)

    def alloc_extend(self, *args, **kwargs):
        raise NotImplementedError("PureSWATokenToKVPoolAllocator does not support page_size > 1")

    def alloc_decode(self, *args, **kwargs):
        raise NotImplementedError("PureSWATokenToKVPoolAllocator does not support page_size > 1")

    def alloc_extend_swa_tail(self, *args, **kwargs):
        raise NotImplementedError("PureSWATokenToKVPoolAllocator does not support page_size > 1")

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(self._copy_for_free_group(free_index))
            return
        # The padding slot never enters the free list, whatever the caller passes.
        self.swa_attn_allocator.free(free_index[free_index > 0])
        assert self.swa_attn_allocator.available_size() <= self.swa_attn_allocator.size

    def free_swa(self, free_index: torch.Tensor) -> None:
        self.free(free_index)

    def free_swa_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        # page_size 1: every start is aligned and each slot is its own page.
        self.free_swa(free_index)

    def free_full(self, free_index: torch.Tensor) -> None:
        # Every layer reads the SWA pool, so there is no separate full slot to
        # give back; free / free_swa already returned the only copy.
        return

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        # The hybrid splits this into SWA + full halves; with one pool both
        # halves are the same slots, so that would release them twice.
        self.free(free_index)

    def free_full_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        return

    def free_group_begin(self) -> None:
        # Not the hybrid's hooks: those open a group on a second allocator and
        # keep an SWA id list, neither of which exists here.
        BaseTokenToKVPoolAllocator.free_group_begin(self)

    def free_group_end(self) -> None:
        pending, self.free_group = self.free_group, None
        if pending:
            self.free(torch.cat(pending))

    def resize(self, config) -> None:
        """One pool: sized by ``config.swa_max_total_num_tokens``."""
        size = int(config.swa_max_total_num_tokens)
        built = self.swa_attn_allocator._built_capacity()
        if size < 0 or size > built:
            raise ValueError(
                f"resize: swa_max_total_num_tokens={size} is outside 0..{built} "
                "(the size this allocator was built with); build a new allocator to grow"
            )
        self._size_full = self._size_swa = size
        self.swa_attn_allocator.size = size
        self.clear()

    def clear(self) -> None:
        self.swa_attn_allocator.clear()
        self.free_group = None


# Releases from this many entries up are deduplicated by marking (see
# SWATokenToKVPoolAllocator._release_swa).
_MARK_DEDUP_MIN = 4096


def _release_page_ids(sub, pages: torch.Tensor) -> None:
    """``sub.free_page_ids(pages)`` for page ids made here (1-D int64, held by
    no caller): the base class's call would copy them first, a subclass's
    free_page_ids is called as it is."""
    if type(sub).free_page_ids is PagedTokenToKVPoolAllocator.free_page_ids:
        sub._release_pages(_as_i64(pages))
    else:
        sub.free_page_ids(pages)


def is_swa_req_ring(allocator) -> bool:
    return isinstance(allocator, SWATokenToKVPoolAllocator) and allocator.swa_req_ring


def _ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def _ceil_to(a: int, b: int) -> int:
    return _ceil_div(a, b) * b
