"""swa-lockstep's device-tensor allocator, with sglang's API and names.

``make_allocator(config)`` builds one from a plain dict; the classes can also
be built directly as sglang builds its own.
"""

from impl.backend import Backend, get_backend
from impl.base import BaseTokenToKVPoolAllocator, PageAlignmentError
from impl.debug import debug_memory_pool, override_debug_memory_pool, set_debug_memory_pool
from impl.factory import make, make_allocator
from impl.invariants import (
    Bucket,
    Invariant,
    InvariantViolation,
    Level,
    current_level,
    expect,
    hit_counts,
    override_level,
    reset_hits,
    set_level,
)
from impl.kv_pool import BaseSWAKVPool, SWAKVPool
from impl.paged import (
    PagedTokenToKVPoolAllocator,
    alloc_decode_naive,
    alloc_extend_naive,
    get_num_new_pages,
)
from impl.req_pool import ReqToTokenPool
from impl.swa import (
    SWA_PEER_MAPPED,
    SWA_PEER_RELEASED,
    PureSWATokenToKVPoolAllocator,
    SWATokenToKVPoolAllocator,
    is_swa_req_ring,
)
from impl.token import TokenToKVPoolAllocator

__all__ = [
    "Backend",
    "BaseSWAKVPool",
    "BaseTokenToKVPoolAllocator",
    "Bucket",
    "Invariant",
    "InvariantViolation",
    "Level",
    "PageAlignmentError",
    "PagedTokenToKVPoolAllocator",
    "PureSWATokenToKVPoolAllocator",
    "ReqToTokenPool",
    "SWAKVPool",
    "SWATokenToKVPoolAllocator",
    "SWA_PEER_MAPPED",
    "SWA_PEER_RELEASED",
    "TokenToKVPoolAllocator",
    "alloc_decode_naive",
    "alloc_extend_naive",
    "current_level",
    "debug_memory_pool",
    "expect",
    "get_backend",
    "get_num_new_pages",
    "hit_counts",
    "is_swa_req_ring",
    "make",
    "make_allocator",
    "override_debug_memory_pool",
    "override_level",
    "reset_hits",
    "set_debug_memory_pool",
    "set_level",
]
