"""Small helpers for the impl tests: tensors from lists, state snapshots."""

import torch

from impl.kv_pool import SWAKVPool
from impl.swa import SWATokenToKVPoolAllocator


def T(*values):
    return torch.tensor(values, dtype=torch.int64)


def free_set(sub):
    """Sorted free page ids of a token or paged allocator (free + staged)."""
    return sorted(sub.get_all_free_pages().tolist())


def hybrid(size=64, size_swa=64, page_size=4, need_sort=False, backend="auto", **kw):
    kv = SWAKVPool(size, size_swa, page_size, "cpu", **kw)
    return SWATokenToKVPoolAllocator(
        size, size_swa, page_size, torch.int64, "cpu", kv, need_sort, backend=backend
    )


def extend(a, prefix, seq, last, **kw):
    pre = torch.tensor(prefix, dtype=torch.int64)
    sl = torch.tensor(seq, dtype=torch.int64)
    ll = torch.tensor(last, dtype=torch.int64)
    n = int((sl - pre).sum())
    return a.alloc_extend(pre, pre.clone(), sl, sl.clone(), ll, n, **kw)


def tail(a, prefix, seq, last, tail_len):
    pre = torch.tensor([prefix], dtype=torch.int64)
    sl = torch.tensor([seq], dtype=torch.int64)
    ll = torch.tensor([last], dtype=torch.int64)
    return a.alloc_extend_swa_tail(pre, pre.clone(), sl, sl.clone(), ll, seq - prefix, tail_len)


def decode(a, seq, last):
    sl = torch.tensor(seq, dtype=torch.int64)
    return a.alloc_decode(sl, sl.clone(), torch.tensor(last, dtype=torch.int64))


def snapshot(a):
    """Everything observable about a hybrid allocator's ownership state."""
    return {
        "full": free_set(a.full_attn_allocator),
        "swa": free_set(a.swa_attn_allocator),
        "map": a.full_to_swa_index_mapping.tolist(),
        "avail": (a.available_size(), a.full_available_size(), a.swa_available_size()),
        "group": a.free_group is not None,
        "swa_group": [t.tolist() for t in getattr(a, "swa_free_group", [])],
    }
