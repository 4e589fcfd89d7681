"""Test-only targets for the Triton layout (needs the triton extra).

`paged_triton`: the bundled allocator with ``layout: "triton"``, for paged
configurations only; at page size 1 no Triton code runs, so it declines (the
differential then spends its examples where the kernels are).

`page_per_index`: a seeded bug in the shape of a kernel contract that assumes
distinct pages. Its SWA release takes one SWA page per freed index, read through
the Triton gather-and-clear, and hands those pages to the free list as they are,
without the page dedup: with every freed index on its own page it is the bundled
allocator; a free with two indices on one page releases that SWA page twice.
"""

from impl import make_allocator
from impl.swa import SWATokenToKVPoolAllocator


def paged_triton(config: dict):
    if config["page_size"] == 1:
        raise NotImplementedError("page size 1 runs no Triton code")
    return make_allocator({**config, "layout": "triton"})


class _PagePerIndex(SWATokenToKVPoolAllocator):
    def free_swa(self, free_index):
        if self.page_size == 1 or self.layout != "triton" or free_index.numel() == 0:
            return super().free_swa(free_index)
        import torch

        ps = self.page_size
        rows = self._gather_and_clear(free_index).view(-1, ps)
        self._backend.zero_fill(self._swa_to_full, rows.reshape(-1))
        # The index's own slot names its SWA page: one page per index, repeats kept.
        own = rows[torch.arange(free_index.numel()), free_index.to(torch.int64) % ps]
        if self.free_group is not None:
            self.swa_free_group.append(own)
            return
        # The bundled release's filters (unpaired slots, pages another full page
        # still pairs into) and its page order; only the dedup is missing.
        pages = own // ps
        on_page = pages[:, None] * ps + torch.arange(ps)[None, :]
        still_paired = self._swa_to_full[on_page].ne(0).any(dim=1)
        pages = pages[(own > 0) & ~still_paired]
        self.swa_attn_allocator._stage(torch.sort(pages).values)


def page_per_index(config: dict):
    a = paged_triton(config)
    a.__class__ = type("page_per_index", (_PagePerIndex,), {"__module__": __name__})
    return a
