"""Test-only targets for the sync check (properties/sync.py).

`bounds_checked_free`: the bundled allocator whose ``free`` first checks the largest
index against the mapping's length, a host read of a device value (``int(t.max())``)
that stalls the stream on CUDA.
"""

from impl import make_allocator
from impl.swa import SWATokenToKVPoolAllocator


class _BoundsCheckedFree(SWATokenToKVPoolAllocator):
    def free(self, free_index):
        if free_index.numel() and int(free_index.max()) >= len(self.full_to_swa_index_mapping) - 1:
            raise IndexError(f"free: index {int(free_index.max())} is past the pool")
        super().free(free_index)


def bounds_checked_free(config: dict):
    a = make_allocator(config)
    a.__class__ = type("bounds_checked_free", (_BoundsCheckedFree,), {"__module__": __name__})
    return a
