"""Token allocator: page_size 1, a free list of slot ids."""

from __future__ import annotations

from typing import Optional

import torch

from impl.base import BaseTokenToKVPoolAllocator


class TokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    def __init__(self, size: int, dtype: torch.dtype, device, kvcache, need_sort: bool):
        super().__init__(size, 1, dtype, device, kvcache, need_sort)
        self._capacity = size
        self.clear()

    def clear(self) -> None:
        # Padded batch entries write their junk KV into slot 0, so it is kept
        # out of circulation for good.
        self._staged, self._num_staged = [], 0
        self.free_pages = torch.arange(1, self.size + 1, dtype=torch.int64, device=self.device)
        self.free_group = None

    def available_size(self) -> int:
        return self._free_pages.shape[0] + self._num_staged

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        if need_size < 0:
            raise ValueError(f"alloc: need_size={need_size} is negative")
        return self._take_pages(int(need_size))

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(self._copy_for_free_group(free_index))
            return
        # A private copy: the caller keeps ownership of its tensor.
        self._stage(free_index.reshape(-1).to(torch.int64, copy=True))

    def free_page_ids(self, page_ids: torch.Tensor) -> None:
        """Free exactly these pages; at page_size 1 a page id is a slot id.

        The caller names no page twice and never page 0. As in sglang 0.5.23
        the token allocator has no debug checks; held by an open free group
        like any free.
        """
        self.free(page_ids)

    def get_cpu_copy(self, indices, mamba_indices=None, req_pool_index=None):
        return self._kv_get_cpu_copy(indices)

    def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None, req_pool_index=None):
        return self._kv_load_cpu_copy(kv_cache_cpu, indices)
