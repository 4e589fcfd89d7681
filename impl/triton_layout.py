"""Triton versions of the paged layouts and of the SWA release's page gather-and-clear.

Selected by the config key ``layout: "triton"`` (``impl.paged.layout_ops``). Each
function takes and returns what its torch counterpart in ``impl.paged`` /
``impl.swa`` does, so the two can be compared slot for slot (SPEC 4.5).

Devices. On CUDA tensors the kernels are compiled. Without a CUDA device this module
sets ``TRITON_INTERPRET=1`` before it imports triton and defines its kernels (the
variable is read when a kernel is decorated), so the same kernels run on CPU tensors
under triton's interpreter; that is how CI on a CPU machine runs them. A process that
has a CUDA device and wants the interpreter sets the variable itself before
importing this module. Either way the variable must be set before anything imports
triton: a triton imported without it cannot interpret (``INTERPRETED`` is then False
and the factory refuses CPU tensors with that reason). Importing ``impl`` never imports this module: only an
allocator built with ``layout: "triton"`` does.
"""

from __future__ import annotations

import os
import sys

import torch


def _interpret_set() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# triton reads the variable when it decorates its own library at import: a triton
# imported earlier without it cannot interpret, whatever is set now.
_IMPORTED_UNINTERPRETED = "triton" in sys.modules and not _interpret_set()
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

INTERPRETED = _interpret_set() and not _IMPORTED_UNINTERPRETED

_TOKENS_PER_BLOCK = 128
_REQS_PER_BLOCK = 128


def runs_on(device) -> bool:
    """Whether these kernels can take tensors on ``device`` in this process."""
    kind = torch.device(device).type
    if INTERPRETED:
        return kind in ("cpu", "cuda")
    return kind == "cuda"


@triton.jit
def _extend_kernel(
    prefix_ptr,
    seq_ptr,
    last_loc_ptr,
    out_start_ptr,
    first_new_ptr,
    pages_ptr,
    last_page,
    out_ptr,
    PS: tl.constexpr,
    HAS_PAGES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One program per request: its positions prefix..seq-1, BLOCK at a time.
    r = tl.program_id(0)
    pre = tl.load(prefix_ptr + r)
    seq = tl.load(seq_ptr + r)
    last = tl.load(last_loc_ptr + r)
    start = tl.load(out_start_ptr + r)
    first = tl.load(first_new_ptr + r)
    pre_pages = (pre + PS - 1) // PS
    cont_end = pre_pages * PS
    for lo in range(pre, seq, BLOCK):
        pos = lo + tl.arange(0, BLOCK)
        live = pos < seq
        # A position on the prefix's partial page continues it; with no new pages
        # every position does (the torch layout's rule for an empty page list).
        if HAS_PAGES:
            cont = pos < cont_end
        else:
            cont = pos >= 0
        # Clamped as the torch layout clamps; continuation lanes load nothing.
        nth = first + pos // PS - pre_pages
        nth = tl.where(nth < 0, 0, tl.where(nth > last_page, last_page, nth))
        page = tl.load(pages_ptr + nth, mask=live & ~cont, other=0)
        slot = tl.where(cont, last + 1 + (pos - pre), page * PS + pos % PS)
        tl.store(out_ptr + start + (pos - pre), slot, mask=live)


@triton.jit
def _decode_kernel(
    seq_ptr, last_loc_ptr, rank_ptr, pages_ptr, out_ptr, n,
    PS: tl.constexpr, HAS_PAGES: tl.constexpr, BLOCK: tl.constexpr,
):
    # A request whose new position opens a page takes the new page of its rank
    # among the openers; every other request continues at last_loc + 1.
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    seq = tl.load(seq_ptr + i, mask=live, other=1)
    last = tl.load(last_loc_ptr + i, mask=live, other=0)
    opens = ((seq - 1) % PS == 0) & live & HAS_PAGES
    page = tl.load(pages_ptr + tl.load(rank_ptr + i, mask=opens, other=0), mask=opens, other=0)
    tl.store(out_ptr + i, tl.where(opens, page * PS, last + 1), mask=live)


@triton.jit
def _gather_pages_kernel(
    idx_ptr, src_ptr, out_ptr, n, PS: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr
):
    # out[r * PS + k] = src[page_of(idx[r]) * PS + k]
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, COLS)
    live = rows < n
    idx = tl.load(idx_ptr + rows, mask=live, other=0)
    cell = live[:, None] & (cols[None, :] < PS)
    slots = (idx // PS * PS)[:, None] + cols[None, :]
    vals = tl.load(src_ptr + slots, mask=cell, other=0)
    tl.store(out_ptr + rows[:, None] * PS + cols[None, :], vals, mask=cell)


@triton.jit
def _clear_pages_kernel(idx_ptr, dst_ptr, n, PS: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, COLS)
    live = rows < n
    idx = tl.load(idx_ptr + rows, mask=live, other=0)
    cell = live[:, None] & (cols[None, :] < PS)
    slots = (idx // PS * PS)[:, None] + cols[None, :]
    zero = tl.zeros((ROWS, COLS), dtype=dst_ptr.dtype.element_ty)
    tl.store(dst_ptr + slots, zero, mask=cell)


def _i64(t: torch.Tensor, device) -> torch.Tensor:
    return t.to(device=device, dtype=torch.int64).contiguous()


def extend_layout(prefix_lens, seq_lens, last_loc, new_pages, page_size, extend_num_tokens):
    """``impl.paged.extend_layout``, one Triton program per request."""
    device = seq_lens.device
    total = int(extend_num_tokens)
    out = torch.empty((total,), dtype=torch.int64, device=device)
    if total == 0:
        return out
    pre, seq = _i64(prefix_lens, device), _i64(seq_lens, device)
    ext = seq - pre
    # Where each request's output starts and which new page is its first: the
    # exclusive prefix sums, on the device (no host read).
    out_start = torch.cumsum(ext, 0) - ext
    new_count = (seq + page_size - 1) // page_size - (pre + page_size - 1) // page_size
    first_new = torch.cumsum(new_count, 0) - new_count
    pages = _i64(new_pages, device)
    _extend_kernel[(len(seq),)](
        pre, seq, _i64(last_loc, device), out_start, first_new, pages, max(pages.numel() - 1, 0), out,
        PS=page_size, HAS_PAGES=pages.numel() > 0, BLOCK=_TOKENS_PER_BLOCK,
    )
    return out


def decode_layout(seq_lens, last_loc, new_pages, page_size):
    """``impl.paged.decode_layout``: one Triton lane per request."""
    device = seq_lens.device
    n = len(seq_lens)
    out = torch.empty((n,), dtype=torch.int64, device=device)
    if n == 0:
        return out
    seq = _i64(seq_lens, device)
    pages = _i64(new_pages, device)
    # Each opener's rank among the openers (an inclusive prefix sum less one, on
    # the device), clamped into the page list as the torch layout clamps it.
    opens = ((seq - 1) % page_size == 0).to(torch.int64)
    rank = (torch.cumsum(opens, 0) - 1).clamp_(0, max(pages.numel() - 1, 0))
    _decode_kernel[(triton.cdiv(n, _REQS_PER_BLOCK),)](
        seq, _i64(last_loc, device), rank, pages, out, n,
        PS=page_size, HAS_PAGES=pages.numel() > 0, BLOCK=_REQS_PER_BLOCK,
    )
    return out


def _page_grid(n: int, page_size: int):
    cols = triton.next_power_of_2(page_size)
    rows = max(1, 256 // cols)
    return (triton.cdiv(n, rows),), rows, cols


def gather_and_clear_pages(indices: torch.Tensor, mapping: torch.Tensor, page_size: int) -> torch.Tensor:
    """The mapping entries of every slot on each page ``indices`` touch, then zero them.

    Returns what ``mapping[expand_to_full_pages(indices)]`` read before the clear:
    ``page_size`` entries per index, in index order, a page touched twice read twice.
    Reading and clearing are two launches: a page may appear under several indices,
    and no program may clear a page another program has yet to read.
    """
    n = indices.numel()
    out = torch.empty((n * page_size,), dtype=mapping.dtype, device=mapping.device)
    if n == 0:
        return out
    idx = _i64(indices.reshape(-1), mapping.device)
    grid, rows, cols = _page_grid(n, page_size)
    _gather_pages_kernel[grid](idx, mapping, out, n, PS=page_size, ROWS=rows, COLS=cols)
    _clear_pages_kernel[grid](idx, mapping, n, PS=page_size, ROWS=rows, COLS=cols)
    return out
