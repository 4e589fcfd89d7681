"""Hybrid allocators whose module publishes a wrong page count, a wrong layout-kernel
stand-in or a wrong ring test beside them, one fault each; the allocator itself is the
bundled one. The driver finds a module's functions through the module of the
allocator's class."""

from __future__ import annotations

import torch

from impl import make_allocator
from impl.paged import alloc_decode_naive as _decode_naive
from impl.paged import alloc_extend_naive as _extend_naive
from impl.paged import get_num_new_pages as _page_count
from impl.swa import SWATokenToKVPoolAllocator
from impl.swa import is_swa_req_ring as _is_ring

FAULT = None  # which of the functions below is wrong: set by the test


class Hybrid(SWATokenToKVPoolAllocator):
    """The bundled hybrid, as a class of this module."""


def make(config: dict):
    alloc = make_allocator(config)
    alloc.__class__ = Hybrid
    return alloc


def get_num_new_pages(seq_lens, page_size, prefix_lens=None, decode=False):
    n = _page_count(seq_lens, page_size, prefix_lens=prefix_lens, decode=decode)
    if FAULT == "empty batch count" and not len(seq_lens):
        return 1
    # One page short for a batch that needs two or more: a scheduler sizing a batch by
    # it admits more than the pool holds.
    return n - 1 if FAULT == "page count" and n > 1 else n


def alloc_extend_naive(prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size, device):
    if FAULT == "extend stand-in" and free_pages.numel() > 1:
        free_pages = torch.flip(free_pages, (0,))  # new pages in reverse request order
    _extend_naive(prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size, device)


def alloc_decode_naive(seq_lens, last_loc, free_pages, out_indices, page_size, num_new_pages):
    _decode_naive(seq_lens, last_loc, free_pages, out_indices, page_size, num_new_pages)
    if FAULT == "decode stand-in" and num_new_pages == 0:
        out_indices.add_(1)  # skips a slot when the decode stays inside its pages


def is_swa_req_ring(allocator):
    # Says yes for every paged allocator, ring or not.
    return _is_ring(allocator) if FAULT != "ring test" else allocator.page_size > 1
