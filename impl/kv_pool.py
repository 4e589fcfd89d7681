"""The SWA KV pool, reduced to what the allocator touches.

Real K/V tensors are not needed to check slot ownership, so each sub-pool
holds one int64 word per slot (``kv_buffer``). A harness writes a tag there
when it hands a slot out and reads it back when the slot's owner frees it;
a tag that changed in between means two owners shared the slot.
"""

from __future__ import annotations

from typing import Optional

import torch


class TagKVPool:
    """One pool's per-slot tag buffer, sized like a real pool (size + page_size)."""

    def __init__(self, size: int, page_size: int, device):
        self.size = size
        self.page_size = page_size
        self.device = device
        # The extra page covers the padding slot 0 and the last page's tail.
        self.kv_buffer = torch.zeros(size + page_size, dtype=torch.int64, device=device)

    def get_cpu_copy(self, indices: torch.Tensor) -> torch.Tensor:
        return self.kv_buffer[indices.to(torch.int64)].cpu()

    def load_cpu_copy(self, kv_cache_cpu: torch.Tensor, indices: torch.Tensor) -> None:
        idx = indices.to(torch.int64)
        if kv_cache_cpu.numel() != idx.numel():
            raise ValueError(
                f"load_cpu_copy: copy holds {kv_cache_cpu.numel()} slots but "
                f"{idx.numel()} indices were given"
            )
        self.kv_buffer[idx] = kv_cache_cpu.to(self.device, torch.int64)


class BaseSWAKVPool:
    """Interface the hybrid allocator needs from its KV pool."""

    full_kv_pool: Optional[TagKVPool] = None
    swa_kv_pool: Optional[TagKVPool] = None
    swa_req_ring_size: Optional[int] = None
    full_to_swa_index_mapping: Optional[torch.Tensor] = None

    def register_mapping(self, full_to_swa_index_mapping: torch.Tensor) -> None:
        raise NotImplementedError

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def invalidate_loc_cache(self) -> None:
        """Nothing cached here; subclasses that cache translations override it."""


class SWAKVPool(BaseSWAKVPool):
    """A full pool and an SWA pool joined by the allocator's mapping."""

    def __init__(
        self,
        size: int,
        size_swa: int,
        page_size: int,
        device,
        swa_req_ring_size: Optional[int] = None,
    ):
        self.size = size
        self.size_swa = size_swa
        self.page_size = page_size
        self.device = device
        self.swa_req_ring_size = swa_req_ring_size
        self.full_kv_pool = TagKVPool(size, page_size, device)
        self.swa_kv_pool = TagKVPool(size_swa, page_size, device)
        self.full_to_swa_index_mapping = None

    def register_mapping(self, full_to_swa_index_mapping: torch.Tensor) -> None:
        # Held by reference: the allocator writes it in place and the
        # attention side must see those writes without a re-register.
        self.full_to_swa_index_mapping = full_to_swa_index_mapping

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        if self.full_to_swa_index_mapping is None:
            raise RuntimeError(
                "translate_loc_from_full_to_swa before register_mapping: "
                "build the allocator over this pool first"
            )
        if kv_indices.dtype is not torch.int64:
            kv_indices = kv_indices.to(torch.int64)
        return self.full_to_swa_index_mapping[kv_indices]

    def get_cpu_copy(self, indices, mamba_indices=None, req_pool_index=None):
        """Tags of the full slots ``indices`` and of their SWA peers (as now mapped).

        Unpaired slots read the SWA padding slot; ``load_cpu_copy`` skips them.
        """
        idx = indices.to(torch.int64)
        swa_idx = self.translate_loc_from_full_to_swa(idx)
        return {
            "full": self.full_kv_pool.get_cpu_copy(idx),
            "swa": self.swa_kv_pool.get_cpu_copy(swa_idx.clamp(min=0)),
        }

    def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None, req_pool_index=None):
        """Write a copy back to ``indices`` and to their SWA peers as mapped now."""
        idx = indices.to(torch.int64)
        self.full_kv_pool.load_cpu_copy(kv_cache_cpu["full"], idx)
        swa_idx = self.translate_loc_from_full_to_swa(idx)
        # The peer may have changed since the copy; only live peers receive data.
        live = (swa_idx > 0).cpu()
        if bool(live.any()):
            self.swa_kv_pool.load_cpu_copy(kv_cache_cpu["swa"][live], swa_idx[live.to(swa_idx.device)])
