"""A test-only target: the bundled allocator as a subclass that overrides, without
changing what they do, the methods the bundled code looks at before it takes a fast
path (the hybrid's `_expand_to_full_pages`; the paged sub-allocators' `_extend`,
`_decode` and `free_page_ids`).

The bundled code then takes the general paths it keeps for subclasses: each pool
computes its own layout, `free` runs as `free_swa` then `free_full`, `free_swa` reads
the mapping through the page expansion, and page ids made inside the allocator go
through the sub-allocator's `free_page_ids`. A subclass's author gets those paths; the
default target never runs them.
"""

from __future__ import annotations

from impl import make_allocator
from impl.paged import PagedTokenToKVPoolAllocator
from impl.swa import PureSWATokenToKVPoolAllocator, SWATokenToKVPoolAllocator


class GeneralPathsHybrid(SWATokenToKVPoolAllocator):
    def _expand_to_full_pages(self, indices):
        return super()._expand_to_full_pages(indices)


class GeneralPathsPaged(PagedTokenToKVPoolAllocator):
    def _extend(self, prefix_lens, seq_lens, last_loc, extend_num_tokens, num_new_pages):
        return super()._extend(prefix_lens, seq_lens, last_loc, extend_num_tokens, num_new_pages)

    def _decode(self, seq_lens, last_loc, num_new_pages):
        return super()._decode(seq_lens, last_loc, num_new_pages)

    def free_page_ids(self, page_ids):
        return super().free_page_ids(page_ids)


def general_paths(config: dict):
    a = make_allocator(config)
    if isinstance(a, PureSWATokenToKVPoolAllocator):
        return a  # page size 1 only: no fast path to step around
    for sub in (a.full_attn_allocator, a.swa_attn_allocator):
        if type(sub) is PagedTokenToKVPoolAllocator:
            sub.__class__ = GeneralPathsPaged
    a.__class__ = GeneralPathsHybrid
    return a
