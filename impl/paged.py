"""Paged allocator (page_size > 1) and its extend / decode layouts.

Layouts are computed with a handful of vectorized torch ops per batch (no
Python loop over requests, no host sync), so they run unchanged on every
device and cost O(tokens + requests).
"""

from __future__ import annotations

from array import array
from typing import Optional

import torch

from impl.base import BaseTokenToKVPoolAllocator, PageAlignmentError, _check_page_aligned


def _ceil_div(a, b):
    return (a + b - 1) // b


def _as_i64(t: torch.Tensor, device=None) -> torch.Tensor:
    # .to() on a tensor already right returns it, at the cost of a call into
    # torch (about 1 us); the hot paths pass int64 on the right device.
    if t.dtype is not torch.int64 or (device is not None and t.device != device):
        return t.to(device=device, dtype=torch.int64)
    return t


def page_of(slots: torch.Tensor, page_size: int) -> torch.Tensor:
    """slots // page_size: a shift when the page size is a power of two
    (int64 floor division costs about 9x a shift on CPU)."""
    if page_size & (page_size - 1) == 0:
        return slots >> (page_size.bit_length() - 1)
    return slots // page_size


def in_page(slots: torch.Tensor, page_size: int) -> torch.Tensor:
    """slots % page_size (a mask at a power-of-two page size, as in page_of)."""
    if page_size & (page_size - 1) == 0:
        return slots & (page_size - 1)
    return slots % page_size


# Up to this many requests the host copies' lengths are summed as Python ints:
# a few torch calls on a small CPU tensor cost about 13 us, the list about 1 us
# at 4 requests and 5 us at 64; past a couple of hundred the tensor is cheaper.
_HOST_LIST_MAX = 128


def get_num_new_pages(seq_lens, page_size: int, prefix_lens=None, decode: bool = False) -> int:
    """Pages a batch needs: sum of ceil(seq/ps) - ceil(prefix/ps).

    Meant for the CPU copies of the lengths, so that the count needs no
    device sync. ``decode=True`` means one new token per request
    (prefix = seq - 1).
    """
    seq = torch.as_tensor(seq_lens, dtype=torch.int64)
    if decode:
        pre = seq - 1
    else:
        if prefix_lens is None:
            raise ValueError("get_num_new_pages: prefix_lens is required unless decode=True")
        pre = torch.as_tensor(prefix_lens, dtype=torch.int64)
    if seq.numel() == 0:
        return 0
    return int((_ceil_div(seq, page_size) - _ceil_div(pre, page_size)).sum())


def extend_layout(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    new_pages: torch.Tensor,
    page_size: int,
    extend_num_tokens: int,
    host_lens: Optional[tuple] = None,
) -> torch.Tensor:
    """Slots for positions prefix..seq-1 of each request, requests in order.

    A position on the prefix's last (partial) page continues it at
    last_loc + 1, + 2, ...; every later position p sits at offset p % ps of
    the request's k-th new page, k = p // ps - ceil(prefix / ps). New pages
    are handed to requests in batch order. That single rule gives the whole
    pages first and one partial last page.

    ``last_loc`` (B,) with ``new_pages`` (P,) gives one layout (total,).
    ``last_loc`` (K, B) with ``new_pages`` (K, P) gives K layouts (K, total)
    over the same lengths: the hybrid lays out its two pools in one pass,
    since only the page ids and the continuation slots differ between them.

    A caller that holds the CPU copies of the lengths passes them as
    ``host_lens`` (prefix_lens_cpu, seq_lens_cpu); a small batch is then laid
    out from its run table (``_extend_runs``), a few tensor ops in place of
    some forty. The choice depends on the call, never on the device, so a
    CPU run takes the paths a GPU run takes.
    """
    ps = page_size
    device = seq_lens.device
    total = int(extend_num_tokens)
    if total == 0:
        return torch.empty(tuple(last_loc.shape[:-1]) + (0,), dtype=torch.int64, device=device)
    if host_lens is not None and host_lens[0].shape[0] + total // ps <= _RUNS_MAX:
        pre, seq = host_lens[0].tolist(), host_lens[1].tolist()
        return _extend_runs(pre, seq, _as_i64(last_loc, device), _as_i64(new_pages, device), ps, total)
    return _extend_vectorized(prefix_lens, seq_lens, last_loc, new_pages, ps, total)


def _extend_vectorized(prefix_lens, seq_lens, last_loc, new_pages, ps: int, total: int) -> torch.Tensor:
    """``extend_layout`` in tensor ops on the device, a fixed count whatever the
    batch: no host read, so it serves large batches and device-only lengths."""
    device = seq_lens.device
    pre = _as_i64(prefix_lens, device)
    seq = _as_i64(seq_lens)
    ext = seq - pre
    start = torch.cumsum(ext, 0) - ext  # first output index of each request
    pre_pages = (pre + (ps - 1)) // ps
    new_count = (seq + (ps - 1)) // ps - pre_pages
    shift = pre - start  # position = output index + shift
    # Per request, in terms of the output index t (one gather for all rows):
    #   continuation slot    = last_loc + 1 - start + t      (one row per pool)
    #   continuation ends    at t = pre_pages * ps - shift
    #   position             = t + shift
    #   index into new_pages = position // ps + (first new page - pre_pages)
    rows = torch.cat(
        (
            (_as_i64(last_loc, device) + 1 - start).reshape(-1, start.shape[0]),
            torch.stack((pre_pages * ps - shift, shift, torch.cumsum(new_count, 0) - new_count - pre_pages)),
        )
    )
    k = rows.shape[0] - 3
    # output_size keeps repeat_interleave from reading ext back to the host.
    g = rows.repeat_interleave(ext, dim=1, output_size=total)
    t = torch.arange(total, device=device)
    out = g[:k] + t
    if new_pages.numel() > 0:
        pos = g[k + 1] + t
        # Continuation tokens compute an out-of-range index; clamp it and let
        # torch.where drop the result, so the shape stays data-independent.
        nth = (page_of(pos, ps) + g[k + 2]).clamp_(0, new_pages.shape[-1] - 1)
        fresh = new_pages.to(device).reshape(k, -1)[:, nth] * ps + in_page(pos, ps)
        out = torch.where(t < g[k], out, fresh)
    return out.reshape(last_loc.shape[:-1] + (total,))


# Up to about this many runs (requests + new pages) the run table is built on
# the host: a Python list costs some 40 ns a run, where the vectorized layout
# costs about 40 tensor ops (60 us) whatever the batch.
_RUNS_MAX = 256


def _extend_runs(pre: list, seq: list, last_loc: torch.Tensor, new_pages: torch.Tensor, ps: int, total: int):
    """``extend_layout`` from the host lengths, as runs of consecutive slots.

    A request's new positions are one run continuing its prefix's last page
    (last_loc + 1, ...), then one run a new page (page * ps, ...), its last
    one partial. Each run's source is a column of ``starts`` (the B
    continuation starts, then the P new pages' first slots), its output
    offset and length are known from the lengths alone, so the whole layout
    is one gather, one repeat and one add over the output.
    """
    src, off, length = [], [], []
    at, page = 0, len(pre)  # output index; column of the next new page
    for i, (a, b) in enumerate(zip(pre, seq)):
        cont_end = min(b, -(-a // ps) * ps)
        if cont_end > a:
            src.append(i), off.append(at), length.append(cont_end - a)
            at = at + cont_end - a
        fresh = b - cont_end
        if fresh > 0:
            n = -(-fresh // ps)
            src.extend(range(page, page + n))
            off.extend(range(at, at + n * ps, ps))
            length.extend([ps] * (n - 1))
            length.append(fresh - (n - 1) * ps)
            at, page = at + fresh, page + n
    device = last_loc.device
    table = torch.frombuffer(array("q", src + off + length), dtype=torch.int64).view(3, -1).to(device)
    starts = torch.cat((last_loc + 1, new_pages * ps), dim=-1)
    base = starts[..., table[0]] - table[1]
    return base.repeat_interleave(table[2], dim=-1, output_size=total) + torch.arange(total, device=device)


def decode_layout(
    seq_lens: torch.Tensor, last_loc: torch.Tensor, new_pages: torch.Tensor, page_size: int
) -> torch.Tensor:
    """Slot of position seq-1 per request: last_loc + 1, or a new page's first slot.

    Shapes as in ``extend_layout``: ``last_loc`` (B,) or (K, B), ``new_pages``
    (P,) or (K, P).
    """
    seq = _as_i64(seq_lens)
    out = _as_i64(last_loc, seq.device) + 1
    if new_pages.numel() > 0:
        opens_page = (seq - 1) % page_size == 0
        nth = (torch.cumsum(opens_page, 0) - 1).clamp_(0, new_pages.shape[-1] - 1)
        out = torch.where(opens_page, new_pages.to(seq.device)[..., nth] * page_size, out)
    return out


def alloc_extend_naive(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    page_size: int,
    device,
) -> None:
    """sglang's torch stand-in for its Triton extend kernel, same arguments.

    Writes the SPEC 2.5 extend layout into ``out_indices`` (its length is the
    number of new positions). New pages are read from the front of
    ``free_pages`` in request order; taking them off the free list is the
    caller's job. ``free_pages`` must hold at least the pages the batch needs:
    an empty one is checked (AssertionError when pages are needed), a short
    one is not.
    """
    total = int(out_indices.shape[0])
    if total == 0:
        return
    pre = prefix_lens.to(device=device, dtype=torch.int64)
    seq = seq_lens.to(device=device, dtype=torch.int64)
    if free_pages.numel() == 0:
        assert torch.equal(_ceil_div(seq, page_size), _ceil_div(pre, page_size)), (
            "alloc_extend_naive: free_pages is empty but the batch needs new pages"
        )
    out_indices.copy_(extend_layout(pre, seq, last_loc, free_pages, page_size, total))


def alloc_decode_naive(
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    page_size: int,
    num_new_pages: int,
) -> None:
    """sglang's torch stand-in for its Triton decode kernel, same arguments:
    the decode layout into ``out_indices``, new pages from the front of
    ``free_pages`` (``num_new_pages`` of them)."""
    if num_new_pages == 0:
        out_indices.copy_(last_loc.to(torch.int64) + 1)
        return
    out_indices.copy_(decode_layout(seq_lens, last_loc, free_pages[:num_new_pages], page_size))


LAYOUTS = ("torch", "triton")


def layout_ops(layout: str):
    """The (extend, decode) layout functions of ``layout``: "torch" (this module) or
    "triton" (``impl.triton_layout``, imported only here, so impl runs without triton)."""
    if layout == "torch":
        return extend_layout, decode_layout
    if layout == "triton":
        from impl import triton_layout

        return triton_layout.extend_layout, triton_layout.decode_layout
    raise ValueError(f"layout={layout!r} is unknown; use one of {', '.join(LAYOUTS)}")


class PagedTokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        device,
        kvcache,
        need_sort: bool,
        *,
        layout: str = "torch",
    ):
        if page_size < 1:
            raise ValueError(f"page_size={page_size} must be >= 1")
        super().__init__(size, page_size, dtype, device, kvcache, need_sort)
        self.layout = layout
        self._extend_layout, self._decode_layout = layout_ops(layout)
        self._capacity = size
        self.num_pages = size // page_size
        self._page_offsets = torch.arange(page_size, dtype=torch.int64, device=device)
        self.clear()

    def clear(self) -> None:
        # Page 0 holds the padding slot: never free.
        self._staged, self._num_staged = [], 0
        self.free_pages = torch.arange(
            1, self.num_pages + 1, dtype=torch.int64, device=self.device
        )
        self.free_group = None
        # Page ids held by an open group (free_page_ids, free_segment).
        self.free_page_ids_group: list[torch.Tensor] = []

    @property
    def staged_pages(self) -> list:
        """sglang 0.5.23's name for the staged chunks (need_sort only; see impl.base)."""
        if self._staged and not self.need_sort:
            self._merge_staged(sort=False)
        return list(self._staged)

    @property
    def num_staged_pages(self) -> int:
        return self._num_staged if self.need_sort else 0

    # ------------------------------------------------------------ alloc

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        if need_size < 0 or need_size % self.page_size != 0:
            raise PageAlignmentError(
                f"alloc: need_size={need_size} is not a non-negative multiple of "
                f"page_size={self.page_size}; round it up to whole pages"
            )
        pages = self._take_pages(need_size // self.page_size)
        if pages is None:
            return None
        return (pages[:, None] * self.page_size + self._page_offsets).reshape(-1)

    @staticmethod
    def _check_batch(name, *tensors) -> None:
        lens = {t.shape[0] for t in tensors}
        if len(lens) != 1:
            raise ValueError(
                f"{name}: batch tensors differ in length ({sorted(lens)}); "
                "pass one entry per request in each"
            )

    @classmethod
    def check_extend_args(
        cls, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens
    ) -> None:
        """Raise ValueError for an extend batch no layout can serve.

        Host-side only: the CPU copies of the lengths exist so nothing syncs.
        """
        cls._checked_extend_pages(
            prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens, 1
        )

    @classmethod
    def _checked_extend_pages(
        cls, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens, page_size
    ) -> int:
        """``check_extend_args``, then the batch's new page count at ``page_size``
        (``get_num_new_pages``): one pass over the host copies for both."""
        cls._check_batch(
            "alloc_extend", prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc
        )
        n = seq_lens_cpu.shape[0]
        if n == 0:
            if int(extend_num_tokens) != 0:
                raise ValueError(
                    f"alloc_extend: extend_num_tokens={extend_num_tokens} but the "
                    "batch extends by 0 tokens; pass sum(seq - prefix)"
                )
            return 0
        ps = page_size
        if n <= _HOST_LIST_MAX:
            pre, seq = prefix_lens_cpu.tolist(), seq_lens_cpu.tolist()
            ext = [b - a for a, b in zip(pre, seq)]
            ext_min, pre_min, ext_sum = min(ext), min(pre), sum(ext)
            pages = sum(-(-b // ps) for b in seq) - sum(-(-a // ps) for a in pre)
        else:
            pre = _as_i64(prefix_lens_cpu)
            seq = _as_i64(seq_lens_cpu)
            ext = seq - pre
            lens = torch.stack((ext, pre, (seq + (ps - 1)) // ps - (pre + (ps - 1)) // ps))
            (ext_min, pre_min, _), (ext_sum, _, pages) = lens.amin(dim=1).tolist(), lens.sum(dim=1).tolist()
        if ext_min < 0:
            raise ValueError("alloc_extend: a seq_len is below its prefix_len")
        if pre_min < 0:
            raise ValueError("alloc_extend: a prefix_len is negative")
        if ext_sum != int(extend_num_tokens):
            raise ValueError(
                f"alloc_extend: extend_num_tokens={extend_num_tokens} but the "
                f"batch extends by {ext_sum} tokens; pass sum(seq - prefix)"
            )
        return pages

    @classmethod
    def check_decode_args(cls, seq_lens, seq_lens_cpu, last_loc) -> None:
        cls._checked_decode_pages(seq_lens, seq_lens_cpu, last_loc, 1)

    @classmethod
    def _checked_decode_pages(cls, seq_lens, seq_lens_cpu, last_loc, page_size) -> int:
        """``check_decode_args``, then the new page count (``get_num_new_pages``
        with decode=True): a request opens a page when its new position
        seq - 1 is a multiple of the page size."""
        cls._check_batch("alloc_decode", seq_lens, seq_lens_cpu, last_loc)
        n = seq_lens_cpu.shape[0]
        if n == 0:
            return 0
        if n <= _HOST_LIST_MAX:
            seq = seq_lens_cpu.tolist()
            lo, pages = min(seq), [(s - 1) % page_size for s in seq].count(0)
        else:
            seq = _as_i64(seq_lens_cpu)
            lo, pages = torch.stack((seq.min(), ((seq - 1) % page_size == 0).sum())).tolist()
        if lo < 1:
            raise ValueError("alloc_decode: every seq_len must be >= 1 (it counts the new token)")
        return pages

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
        num_new_pages: Optional[int] = None,
    ) -> Optional[torch.Tensor]:
        counted = self._checked_extend_pages(
            prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens,
            self.page_size,
        )
        if num_new_pages is None:
            num_new_pages = counted
        return self._extend(prefix_lens, seq_lens, last_loc, extend_num_tokens, num_new_pages)

    def _extend(self, prefix_lens, seq_lens, last_loc, extend_num_tokens, num_new_pages):
        """alloc_extend after its argument checks (the hybrid checks once for both pools)."""
        if self.debug_mode:
            # Only a row that continues a page reads last_loc. (sglang checks
            # every row, so an aligned prefix whose last SWA peer was evicted,
            # translated to last_loc 0, trips its check on a legal call.)
            ps = self.page_size
            cont = prefix_lens % ps != 0
            assert torch.all(((last_loc + 1) % ps == prefix_lens % ps) | ~cont), (
                "alloc_extend: last_loc does not sit just before prefix_len in its page"
            )
        pages = self._take_pages(int(num_new_pages))
        if pages is None:
            return None
        out = self._extend_layout(
            prefix_lens, seq_lens, last_loc, pages, self.page_size, extend_num_tokens
        )
        if self.debug_mode:
            assert len(torch.unique(out)) == len(out), "extend layout repeats a slot"
        return out

    def alloc_decode(
        self,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
    ) -> Optional[torch.Tensor]:
        num_new_pages = self._checked_decode_pages(seq_lens, seq_lens_cpu, last_loc, self.page_size)
        return self._decode(seq_lens, last_loc, num_new_pages)

    def _decode(self, seq_lens, last_loc, num_new_pages):
        """alloc_decode after its argument checks."""
        if self.debug_mode:
            ps = self.page_size
            cont = (seq_lens - 1) % ps != 0  # as in _extend: rows that read last_loc
            assert torch.all(((last_loc + 2) % ps == seq_lens % ps) | ~cont), (
                "alloc_decode: last_loc does not sit just before the new position in its page"
            )
        pages = self._take_pages(num_new_pages)
        if pages is None:
            return None
        out = self._decode_layout(seq_lens, last_loc, pages, self.page_size)
        if self.debug_mode:
            assert len(torch.unique(out)) == len(out), "decode layout repeats a slot"
        return out

    # ------------------------------------------------------------ free

    def free(self, free_index: torch.Tensor) -> None:
        """Release every page ``free_index`` touches, each once."""
        if free_index.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(self._copy_for_free_group(free_index))
            return
        pages = torch.unique(page_of(_as_i64(free_index), self.page_size))
        if self.debug_mode:
            self._debug_check_release(pages, "free")
        self._stage(pages)

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """Release the pages under one request's positions start_pos.. .

        Because ``start_pos`` is a page boundary and a request fills each of
        its pages in position order, element 0, ps, 2*ps, ... of
        ``free_index`` lands on each page exactly once. A strided slice has a
        size known in advance, unlike ``torch.unique``.
        """
        _check_page_aligned(start_pos, self.page_size)
        if free_index.numel() == 0:
            return
        reps = free_index[:: self.page_size]
        if self.debug_mode:
            assert torch.equal(
                torch.sort(reps.cpu() // self.page_size).values,
                torch.unique(free_index.cpu() // self.page_size),
            ), "free_segment: the row's positions are not page-consecutive"
        self.free_page_ids(reps.to(torch.int64) // self.page_size)

    def free_page_ids(self, page_ids: torch.Tensor) -> None:
        """Release exactly these pages: no dedup, so none may be named twice,
        and page 0 never (debug mode checks both, and that none is free).

        Inside a free group they are held (a copy) until ``free_group_end``.
        """
        if page_ids.numel() == 0:
            return
        # A copy: the caller may overwrite its tensor while the pages wait.
        self._release_pages(page_ids.reshape(-1).to(torch.int64, copy=True))

    def _release_pages(self, pages: torch.Tensor) -> None:
        """``free_page_ids`` of a 1-D int64 tensor that no caller holds, so
        that it can be held or staged as it is (the hybrid's frees make
        their page ids themselves; two copies cost 4 of a free's 18 ops)."""
        if self.free_group is not None:
            self.free_page_ids_group.append(pages)
            return
        if self.debug_mode:
            self._debug_check_release(pages, "free_page_ids")
        self._stage(pages)

    def free_group_begin(self) -> None:
        super().free_group_begin()
        self.free_page_ids_group = []

    def free_group_end(self) -> None:
        parts = []
        if self.free_group:
            parts.append(torch.unique(torch.cat(self.free_group).to(torch.int64) // self.page_size))
        if self.free_page_ids_group:
            parts.append(torch.cat(self.free_page_ids_group).to(torch.int64))
        pages = torch.cat(parts) if parts else None
        if self.debug_mode and pages is not None:
            # Before the group closes: a refused end leaves the group as it was.
            self._debug_check_release(pages, "free_group_end")
        self.free_group, self.free_page_ids_group = None, []
        if pages is not None:
            self._stage(pages)

    def get_cpu_copy(self, indices, mamba_indices=None, req_pool_index=None):
        return self._kv_get_cpu_copy(indices)

    def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None, req_pool_index=None):
        return self._kv_load_cpu_copy(kv_cache_cpu, indices)
