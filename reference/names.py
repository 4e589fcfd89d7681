"""The names the harness reports, shared by the model, the properties and the corpus."""

# SPEC 3.3: invariants the harness enforces.
PEER_MAPPED = "swa.peer_mapped"
PEER_RELEASED = "swa.peer_released"
NO_DOUBLE_OWNERSHIP = "pool.no_double_ownership"
NO_LEAK = "pool.no_leak"
PADDING_RESERVED = "pool.padding_reserved"
CAPACITY = "pool.capacity"
SENTINEL = "map.sentinel"
MAP_LIVE = "map.live"
LAYOUT = "alloc.layout"
ATOMIC = "alloc.atomic"
GROUP_DEFERRED = "group.deferred"
KV_INTEGRITY = "kv.integrity"
KV_RESOLVE = "kv.resolve"
DTYPE = "alloc.dtype"

INVARIANTS = (
    PEER_MAPPED,
    PEER_RELEASED,
    NO_DOUBLE_OWNERSHIP,
    NO_LEAK,
    PADDING_RESERVED,
    CAPACITY,
    SENTINEL,
    MAP_LIVE,
    LAYOUT,
    ATOMIC,
    GROUP_DEFERRED,
    KV_INTEGRITY,
    KV_RESOLVE,
    DTYPE,
)

# SPEC 3.2: how the allocator must react to a broken contract.
ERROR = "error"  # a clear exception, state unchanged
UNNOTICED = "unnoticed"  # the allocator need not notice; the harness does
GUARDS = (PEER_MAPPED, PEER_RELEASED)
