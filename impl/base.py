"""Base class of the token-to-KV-pool allocators.

Free list, staging and free groups live here, shared by the token and paged
allocators; a free list holds page ids (for page_size 1 a page is a slot).

Cost model. A call must cost O(slots it touches), never O(pool):

- ``alloc`` takes a slice view off the front of ``free_pages``: no copy.
- ``free`` appends the released page ids, as one small tensor, to a staging
  list (``_staged``): no concatenation with the free list.
- Only when an allocation finds ``free_pages`` too short are the staged
  chunks merged into it (and sorted when ``need_sort``). At that moment the
  free list is shorter than the request, so a merge costs the request plus
  what was staged since the last merge: each released page is merged once.

Reuse order follows from that and is the same on every device: pages go out
in free-list order; released pages come back at the next merge, behind what
is left (need_sort=False) or sorted together with it (need_sort=True).

What callers read. sglang's code reads ``free_pages`` and ``release_pages``
directly. With need_sort=False sglang has no staging area: a free goes straight
into ``free_pages``. Here the staging list stays private and ``free_pages`` is
a property that folds it in, unsorted and behind the rest, when it is read; the
fold is the same one the next short alloc would do, so reading never changes
which page goes out next, and frees stay O(touched) whether or not anyone
looks. With need_sort=True staged pages are what sglang keeps in
``release_pages``, and that property shows them (``free_pages`` does not).
"""

from __future__ import annotations

import abc
from typing import Optional

import torch

from impl.debug import debug_memory_pool
from impl.invariants import hit_counts


class PageAlignmentError(ValueError, AssertionError):
    """A segment start or a paged alloc size that is not a multiple of page_size.

    sglang asserts these, so its callers catch AssertionError; everywhere else
    this implementation reports a bad argument as ValueError. The class is both.
    """


def _check_page_aligned(start_pos: int, page_size: int) -> None:
    if int(start_pos) % page_size != 0:
        raise PageAlignmentError(
            f"free_segment start_pos={start_pos} is not aligned to "
            f"page_size={page_size}; pass a start that is a multiple of the "
            "page size (the segment's end may sit mid-page)"
        )


class BaseTokenToKVPoolAllocator(abc.ABC):
    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        device,
        kvcache,
        need_sort: bool,
    ):
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.device = device
        self._kvcache = kvcache
        self.need_sort = need_sort
        # Read once at construction, as sglang does (see impl.debug).
        self.debug_mode = debug_memory_pool()

        self._staged: list[torch.Tensor] = []
        self.free_pages: Optional[torch.Tensor] = None
        self._num_staged = 0
        # None: a free releases at once. A list: frees wait for free_group_end.
        self.free_group: Optional[list] = None

    # ------------------------------------------------------------ sizes

    @property
    def size_full(self):
        return self.size

    def available_size(self) -> int:
        if self._free_pages is None:
            return 0
        return (self._free_pages.shape[0] + self._num_staged) * self.page_size

    def get_kvcache(self):
        return self._kvcache

    def invariant_hits(self) -> dict[str, int]:
        """Cumulative invariant hits by name (process-wide; see impl.invariants)."""
        return hit_counts()

    def debug_print(self) -> str:
        return ""

    # ------------------------------------------------------------ free list

    _free_pages: Optional[torch.Tensor] = None

    @property
    def free_pages(self) -> Optional[torch.Tensor]:
        """The free list as sglang's code reads it (see the module docstring)."""
        if self._staged and not self.need_sort:
            self._merge_staged(sort=False)
        return self._free_pages

    @free_pages.setter
    def free_pages(self, value: Optional[torch.Tensor]) -> None:
        self._free_pages = value

    @property
    def is_not_in_free_group(self) -> bool:
        """Older sglang's name for ``free_group is None``."""
        return self.free_group is None

    @property
    def release_pages(self) -> Optional[torch.Tensor]:
        """Freed pages not yet in ``free_pages``: empty unless need_sort (O(staged))."""
        if self._free_pages is None:
            return None
        if self._staged and not self.need_sort:
            self._merge_staged(sort=False)
        if not self._staged:
            return self._free_pages.new_empty((0,))
        return torch.cat(self._staged)

    @release_pages.setter
    def release_pages(self, value) -> None:
        # sglang code assigns this attribute; keep that working on the staging list.
        if value is None or value.numel() == 0:
            self._staged, self._num_staged = [], 0
        else:
            self._staged, self._num_staged = [value.to(torch.int64)], value.numel()

    def get_all_free_pages(self) -> Optional[torch.Tensor]:
        """Every free page id, free list and staging together (slot ids at page_size 1)."""
        if self._free_pages is None:
            return None
        if not self._staged:
            return self._free_pages
        return torch.cat([self._free_pages, *self._staged])

    def _stage(self, page_ids: torch.Tensor) -> None:
        # The caller hands over a tensor nobody else holds (see callers).
        if page_ids.numel() == 0:
            return
        self._staged.append(page_ids)
        self._num_staged += page_ids.numel()

    def _merge_staged(self, sort: bool) -> None:
        if not self._staged:
            return
        merged = torch.cat([self._free_pages, *self._staged])
        self._free_pages = torch.sort(merged).values if sort else merged
        self._staged, self._num_staged = [], 0

    def merge_and_sort_free(self) -> None:
        """Fold staged pages into the free list and sort it."""
        self._merge_staged(sort=True)

    def _take_pages(self, num_pages: int) -> Optional[torch.Tensor]:
        """The next ``num_pages`` free page ids, or None (nothing taken)."""
        free = self._free_pages
        if num_pages > free.shape[0]:
            if num_pages > free.shape[0] + self._num_staged:
                return None
            self._merge_staged(sort=self.need_sort)
            free = self._free_pages
        out = free[:num_pages]
        self._free_pages = free[num_pages:]
        return out

    def _debug_check_release(self, page_ids: torch.Tensor, what: str) -> None:
        """Debug mode: each page in 1..num_pages, none twice, none already free.

        Checked before anything changes (an O(pool) scan and a host sync, so
        debug mode only). sglang checks after the release, for duplicates only.
        """
        pages = page_ids.reshape(-1).to(torch.int64).cpu()
        if pages.numel() == 0:
            return
        num_pages = self.size // self.page_size
        assert int(pages.min()) >= 1, f"{what}: page 0 holds the padding slot and is never freed"
        assert int(pages.max()) <= num_pages, f"{what}: page {int(pages.max())} is beyond the pool's {num_pages}"
        assert torch.unique(pages).numel() == pages.numel(), f"{what}: a page is named twice"
        already = torch.isin(pages, self.get_all_free_pages().cpu())
        assert not bool(already.any()), (
            f"{what}: pages {pages[already].tolist()[:8]} are already free (a page freed twice)"
        )

    # ------------------------------------------------------------ free groups

    def free_group_begin(self) -> None:
        if self.free_group is not None:
            raise RuntimeError(
                "free_group_begin: a free group is already open and groups do "
                "not nest; call free_group_end first"
            )
        self.free_group = []

    def free_group_end(self) -> None:
        pending, self.free_group = self.free_group, None
        if pending:
            self.free(torch.cat(pending))

    @staticmethod
    def _copy_for_free_group(free_index: torch.Tensor) -> torch.Tensor:
        # The caller may overwrite its view (a request's token row) before
        # the group ends; the group must keep what was freed.
        return free_index.clone()

    # ------------------------------------------------------------ frees

    def free_full(self, free_index: torch.Tensor) -> None:
        """Free slots whose SWA peers are already gone; one pool has none."""
        self.free(free_index)

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """Free the ``n`` positions of one request that begin at ``start_pos``.

        The start has to be a multiple of page_size; the last position may
        fall anywhere in its page, which goes back to the pool in full.
        """
        _check_page_aligned(start_pos, self.page_size)
        self.free(free_index)

    def free_full_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """``free_full`` for one request's positions start_pos.. (alignment as free_segment)."""
        _check_page_aligned(start_pos, self.page_size)
        self.free_full(free_index)

    def free_full_segments(self, segments) -> None:
        """``free_segments`` for the full side alone; the list is checked first."""
        for free_index, start_pos in self._check_segments(segments):
            if free_index.numel():
                self.free_full_segment(free_index, start_pos=start_pos)

    def translate_kv_indices_for_transfer(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """Slot ids as a KV transfer addresses them: the ids themselves here."""
        return kv_indices

    def _check_segments(self, segments) -> list:
        segments = list(segments)
        ps = self.page_size
        prev_end = None
        for free_index, start_pos in segments:
            _check_page_aligned(start_pos, ps)
            n = free_index.numel()
            if n == 0:
                continue
            # A later page than the previous segment's last one: ascending,
            # and no page released by two segments.
            if prev_end is not None and start_pos // ps <= (prev_end - 1) // ps:
                raise ValueError(
                    f"free_segments: segment at start_pos={start_pos} is not after "
                    f"the previous one ending at {prev_end} on a later page "
                    f"(page_size={ps}); pass segments ascending, no two on one page"
                )
            prev_end = start_pos + n
        return segments

    def free_segments(self, segments) -> None:
        """Several ``(free_index, start_pos)`` pieces of one request at once.

        Pieces come in position order and never share a page. The whole list
        is checked before the first piece is freed, so a bad list is a no-op.
        """
        segments = self._check_segments(segments)
        for free_index, start_pos in segments:
            if free_index.numel():
                self.free_segment(free_index, start_pos=start_pos)

    # ------------------------------------------------------------ paged-only calls

    def alloc_extend(self, *args, **kwargs):
        raise NotImplementedError("alloc_extend needs a paged allocator (page_size > 1)")

    def alloc_decode(self, *args, **kwargs):
        raise NotImplementedError("alloc_decode needs a paged allocator (page_size > 1)")

    # ------------------------------------------------------------ cpu copies

    def get_cpu_copy(self, indices, mamba_indices=None, req_pool_index=None):
        raise NotImplementedError("get_cpu_copy needs an allocator with a KV pool")

    def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None, req_pool_index=None):
        raise NotImplementedError("load_cpu_copy needs an allocator with a KV pool")

    def _kv_get_cpu_copy(self, indices):
        return self._kvcache.get_cpu_copy(indices)

    def _kv_load_cpu_copy(self, kv_cache_cpu, indices):
        return self._kvcache.load_cpu_copy(kv_cache_cpu, indices)

    # ------------------------------------------------------------ lifecycle

    def _built_capacity(self) -> int:
        return getattr(self, "_capacity", self.size)

    def resize(self, config) -> None:
        """Shrink to ``config.max_total_num_tokens`` slots and clear.

        Growing is refused: the KV buffers were sized at construction.
        """
        new_size = int(config.max_total_num_tokens)
        if new_size < 0 or new_size > self._built_capacity():
            raise ValueError(
                f"resize: max_total_num_tokens={new_size} is outside 0.."
                f"{self._built_capacity()} (the size this allocator was built "
                "with); build a new allocator to grow"
            )
        self.size = new_size
        if self.page_size > 1:
            self.num_pages = new_size // self.page_size
        self.clear()

    @abc.abstractmethod
    def clear(self) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def alloc(self, need_size: int):
        raise NotImplementedError

    @abc.abstractmethod
    def free(self, free_index: torch.Tensor) -> None:
        raise NotImplementedError
