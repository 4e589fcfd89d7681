"""Reads a target allocator's state into plain Python, through sglang's own names.

Everything the comparison needs goes through here, so a target only has to have
sglang's attributes: `full_attn_allocator`, `swa_attn_allocator` (each with
`free_pages` and `release_pages`), `full_to_swa_index_mapping`, the
`*available_size()` methods, and optionally `invariant_hits()` and a KV pool whose
sub-pools hold a tag buffer (`kv_buffer`).
"""

from __future__ import annotations

import sys

import torch


def sizes(alloc) -> dict[str, int]:
    return {
        "available_size": int(alloc.available_size()),
        "full_available_size": int(alloc.full_available_size()),
        "swa_available_size": int(alloc.swa_available_size()),
    }


def capacities(alloc) -> dict[str, int]:
    """The pool sizes the target reports (`size_full`, `size_swa`, `size`), those it has."""
    out = {}
    for key in ("size_full", "size_swa", "size"):
        value = getattr(alloc, key, None)
        if callable(value):
            value = value()
        if _is_number(value):
            out[key] = value
    return out


def _is_number(value) -> bool:
    """A size a target reports: an int, or a float from a true division, which must
    still be the model's size."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def outside_group(alloc) -> bool | None:
    """Older sglang's `is_not_in_free_group` (an attribute there, a property or a
    method elsewhere), or None where the target has none."""
    value = getattr(alloc, "is_not_in_free_group", None)
    if callable(value):
        value = value()
    return value if isinstance(value, bool) else None


def sub_allocators(alloc) -> list:
    """The full and SWA sub-allocators, once each: pure SWA has one for both."""
    subs = [alloc.full_attn_allocator]
    if alloc.swa_attn_allocator is not subs[0]:
        subs.append(alloc.swa_attn_allocator)
    return subs


# Functions an allocator's module publishes beside its classes, which sglang's schedulers
# and kernels call: the page count a batch needs, the torch stand-ins of the Triton
# layout kernels (same arguments as the kernels), and whether an allocator keeps SWA
# rings per request.
MODULE_FUNCTIONS = ("get_num_new_pages", "alloc_extend_naive", "alloc_decode_naive", "is_swa_req_ring")


def module_functions(alloc) -> dict[str, object]:
    """Those of MODULE_FUNCTIONS that the module of the allocator's class, or of a
    sub-allocator's class, defines or imports (the first found), by name."""
    out = {}
    for obj in (alloc, *sub_allocators(alloc)):
        module = sys.modules.get(type(obj).__module__)
        for name in MODULE_FUNCTIONS:
            fn = getattr(module, name, None)
            if name not in out and callable(fn):
                out[name] = fn
    return out


def sub_facts(sub) -> dict[str, object]:
    """What a sub-allocator says of the pool it serves, those of `size`, `num_pages`,
    `page_size`, `dtype`, `device` and `get_kvcache()` it has: sglang code reads them
    on the sub-allocators directly, not only through the hybrid."""
    out: dict[str, object] = {}
    for key in ("size", "num_pages", "page_size"):
        value = getattr(sub, key, None)
        if _is_number(value):
            out[key] = value
    for key in ("dtype", "device"):
        if hasattr(sub, key):
            out[key] = getattr(sub, key)
    if callable(getattr(sub, "get_kvcache", None)):
        out["kvcache"] = sub.get_kvcache()
    return out


def free_page_tensor(sub) -> torch.Tensor:
    """Free and staged pages (slots at page_size 1) of one sub-allocator, as one int64
    tensor on its device: for whole-pool comparisons that stay vectorized.

    Its `free_pages` and `release_pages`; where it stages in `staged_pages` (sglang
    0.5.23's paged allocator stages frees in a list of its own), `get_all_free_pages()`."""
    get_all = getattr(sub, "get_all_free_pages", None)
    if hasattr(sub, "staged_pages") and callable(get_all):
        pages = get_all()
        if pages is not None:
            return pages.reshape(-1).to(torch.int64)
    parts = [sub.free_pages]
    staged = getattr(sub, "release_pages", None)
    if staged is not None and staged.numel():
        parts.append(staged)
    return torch.cat([p.reshape(-1).to(torch.int64) for p in parts])


def free_pages(sub) -> list[int]:
    """Free and staged pages (slots at page_size 1) of one sub-allocator."""
    return free_page_tensor(sub).tolist()


def free_mask(sub, pages: list[int]) -> list[bool]:
    """Whether each of `pages` is free or staged in one sub-allocator, without copying
    the pool's list to the host: a mask over page ids, O(pool) on the device
    (torch.isin sorts the pool on every call)."""
    if not pages:
        return []
    pool = free_page_tensor(sub)
    n = max(pages) + 1
    mask = torch.zeros(n + 1, dtype=torch.bool, device=pool.device)  # index n: "no such page"
    mask[pool[(pool >= 0) & (pool < n)]] = True
    return mask[torch.tensor([p if p >= 0 else n for p in pages], dtype=torch.int64, device=pool.device)].tolist()


def mapping_tensor(alloc) -> torch.Tensor:
    """The full-to-SWA mapping itself (sentinel last), for vectorized comparison."""
    return alloc.full_to_swa_index_mapping


def mapping(alloc) -> list[int]:
    return alloc.full_to_swa_index_mapping.tolist()


OUTSIDE = -2  # the peer read for a full slot outside the mapping: no real peer is -2


def peers(alloc, full_slots: list[int]) -> list[int]:
    if not full_slots:
        return []
    m = alloc.full_to_swa_index_mapping
    n = m.numel()
    inside = [f for f in full_slots if 0 <= f < n]
    got = iter(m[torch.tensor(inside, dtype=torch.int64, device=m.device)].tolist() if inside else [])
    # A slot the target handed out beyond its own mapping has no peer to read; the
    # model reports the slot itself (pool.capacity), so the read must not fail here.
    return [next(got) if 0 <= f < n else OUTSIDE for f in full_slots]


def resolve(alloc, full_slots: list[int]) -> dict[str, torch.Tensor]:
    """Where attention reads the SWA KV of these full slots: through the KV pool's
    registered mapping and through the allocator's own translate, as each returns
    it (a tensor, compared for dtype, device and shape too). Empty where the target
    has neither (a target without an SWA KV pool)."""
    if not full_slots:
        return {}
    out = {}
    m = alloc.full_to_swa_index_mapping
    idx = torch.tensor(full_slots, dtype=torch.int64, device=m.device)
    kv = alloc.get_kvcache() if hasattr(alloc, "get_kvcache") else None
    if hasattr(kv, "translate_loc_from_full_to_swa"):
        out["the KV pool's translate_loc_from_full_to_swa"] = kv.translate_loc_from_full_to_swa(idx)
    if hasattr(alloc, "translate_loc_from_full_to_swa"):
        out["translate_loc_from_full_to_swa"] = alloc.translate_loc_from_full_to_swa(idx)
    # A KV transfer (disaggregated prefill) moves the SWA KV at these slots.
    if hasattr(alloc, "translate_swa_indices_for_transfer"):
        out["translate_swa_indices_for_transfer"] = alloc.translate_swa_indices_for_transfer(idx)
    return out


def sentinel(alloc) -> int:
    return int(alloc.full_to_swa_index_mapping[-1])


def hits(alloc) -> dict[str, int] | None:
    f = getattr(alloc, "invariant_hits", None)
    return None if f is None else dict(f())


class Tags:
    """Tags written into the KV pools at allocation and read back at free (kv.integrity).

    A sub-pool's tag buffer is its `kv_buffer` (the bundled pool: one word per slot),
    else the first layer of its `k_buffer` (sglang's MHA pool, one value per slot when
    built with one head of width 1; float64 holds every tag exactly)."""

    def __init__(self, alloc):
        kv = alloc.get_kvcache() if hasattr(alloc, "get_kvcache") else None
        self.full = self._buffer(getattr(kv, "full_kv_pool", None))
        self.swa = self._buffer(getattr(kv, "swa_kv_pool", None))
        self.enabled = isinstance(self.full, torch.Tensor) and isinstance(self.swa, torch.Tensor)

    @staticmethod
    def _buffer(pool):
        buf = getattr(pool, "kv_buffer", None)
        if isinstance(buf, torch.Tensor):
            return buf
        layers = getattr(pool, "k_buffer", None)
        if layers and isinstance(layers[0], torch.Tensor) and layers[0][0].numel() == 1 and layers[0].dtype == torch.float64:
            return layers[0].view(-1)
        return None

    @staticmethod
    def value(rid: int, pos: int) -> int:
        return (rid + 1) * (1 << 24) + pos

    def _idx(self, buf, slots):
        return torch.tensor(slots, dtype=torch.int64, device=buf.device)

    def write(self, buf_name: str, slots: list[int], values: list[int]) -> None:
        if not self.enabled or not slots:
            return
        buf = getattr(self, buf_name)
        buf[self._idx(buf, slots)] = torch.tensor(values, dtype=buf.dtype, device=buf.device)

    def read(self, buf_name: str, slots: list[int]) -> list[int]:
        if not self.enabled or not slots:
            return []
        buf = getattr(self, buf_name)
        return [int(v) for v in buf[self._idx(buf, slots)].tolist()]
