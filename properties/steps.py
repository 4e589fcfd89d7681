"""The workload language: steps by request and position, never by raw slot id.

A step names requests (`rid`) and positions in their rows; the lockstep driver turns
it into allocator calls against whatever slots the target handed out. So one list of
steps replays on any target and device. Each step's repr is valid Python and its
`to_json` round-trips through `step_from_json`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class Step:
    op: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = [list(x) if isinstance(x, tuple) else x for x in v] if isinstance(v, tuple) else v
        return out


@dataclass(frozen=True)
class Admit(Step):
    """New requests (rid, length) from prefix 0, in one batch."""

    op: ClassVar[str] = "admit"
    reqs: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class AdmitTail(Step):
    """One new request whose SWA KV covers only its last `tail` positions."""

    op: ClassVar[str] = "admit_tail"
    rid: int
    length: int
    tail: int


@dataclass(frozen=True)
class Extend(Step):
    """Chunked prefill: each (rid, add) grows by `add` positions, in one batch."""

    op: ClassVar[str] = "extend"
    reqs: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Decode(Step):
    """One new position for each request, in one batch."""

    op: ClassVar[str] = "decode"
    rids: tuple[int, ...]


@dataclass(frozen=True)
class Evict(Step):
    """Window eviction: release the SWA peers of positions lo..hi-1 (free_swa)."""

    op: ClassVar[str] = "evict"
    rid: int
    lo: int
    hi: int


@dataclass(frozen=True)
class Repair(Step):
    """Host-cache load-back: pair evicted positions lo..lo+n-1 with new SWA slots,
    starting `offset` slots into the first new SWA page."""

    op: ClassVar[str] = "repair"
    rid: int
    lo: int
    n: int
    offset: int
    # The SWA indices as a cache keeps them (an int32 copy of a kv row), not as the
    # sub-allocator returned them.
    swa_int32: bool = False


@dataclass(frozen=True)
class Finish(Step):
    """Release a request: how is "split" (free_full of unpaired runs, free of the
    rest), "free" (free of the whole row) or "segments" (free_segments by page)."""

    op: ClassVar[str] = "finish"
    rid: int
    how: str


@dataclass(frozen=True)
class DropTail(Step):
    """free_segment of positions keep.. of a request; it keeps the first `keep`."""

    op: ClassVar[str] = "drop_tail"
    rid: int
    keep: int


# `Prefill.batch` entries name where a request's prefix comes from.
NEW = -1  # a new request, prefix 0


@dataclass(frozen=True)
class Prefill(Step):
    """One prefill batch as a scheduler forms it, entries in batch order. Each entry is
    (rid, src, prefix, add): src NEW is a new request from prefix 0; src == rid is a
    chunked continuation of live request rid from its current length (prefix); any
    other src is a cached entry (a finished request the cache kept) whose first
    `prefix` positions the new request reuses. A prefix that ends inside a page
    takes the whole entry over (the cache hands the request its last page), so it
    must be the entry's length."""

    op: ClassVar[str] = "prefill"
    batch: tuple[tuple[int, int, int, int], ...]


@dataclass(frozen=True)
class Retract(Step):
    """Retract a batch: copy each request's KV to the host (get_cpu_copy), then free
    their slots in one call per kind, over the requests' rows concatenated."""

    op: ClassVar[str] = "retract"
    rids: tuple[int, ...]


@dataclass(frozen=True)
class Resume(Step):
    """Re-admit retracted requests in one batch and load their host copies back
    (load_cpu_copy); what they read afterwards must be what they had."""

    op: ClassVar[str] = "resume"
    rids: tuple[int, ...]


@dataclass(frozen=True)
class CacheFree(Step):
    """A cache eviction: one `call` (free, free_swa or free_full) over the positions
    lo..hi-1 of several cached entries, concatenated in the order given; with
    `interleave`, taken round-robin one position from each piece in turn (a
    token-major layout, so a page recurs with other pages between)."""

    op: ClassVar[str] = "cache_free"
    call: str
    pieces: tuple[tuple[int, int, int], ...]
    interleave: bool = False


@dataclass(frozen=True)
class Empty(Step):
    """A call with no positions at all (`call` of an empty index tensor, or alloc(0)),
    as a scheduler makes when a request's KV is all cached: it must change nothing."""

    op: ClassVar[str] = "empty"
    call: str


@dataclass(frozen=True)
class GroupBegin(Step):
    op: ClassVar[str] = "group_begin"


@dataclass(frozen=True)
class GroupEnd(Step):
    op: ClassVar[str] = "group_end"


@dataclass(frozen=True)
class MergeSort(Step):
    op: ClassVar[str] = "merge_sort"


@dataclass(frozen=True)
class Clear(Step):
    op: ClassVar[str] = "clear"


@dataclass(frozen=True)
class Resize(Step):
    op: ClassVar[str] = "resize"
    size: int
    size_swa: int


# Deliberate contract breaks (SPEC 3.2): kind -> how the allocator must react.
# "guard": one of its own guards (swa.peer_mapped / swa.peer_released) watches it,
# crashing, counting or silent by level; "error": a clear error, state unchanged;
# "unnoticed": the allocator need not notice, the harness must (never sent as legal);
# "debug": unnoticed, but refused in sglang's debug mode (SGLANG_DEBUG_MEMORY_POOL).
BREAKS: dict[str, str] = {
    "free_unpaired": "guard",  # free at page_size 1 of a position whose SWA peer is gone
    "free_full_paired": "guard",  # free_full of a position that still has an SWA peer
    "segment_unpaired": "guard",  # free_swa_segment of a page whose representative has no SWA peer
    "double_free": "unnoticed",  # free again the slots of a finished request
    "never_allocated": "unnoticed",  # free a slot on a free page
    "partial_page": "unnoticed",  # free one position of a page whose others are in use
    "nested_group": "error",  # free_group_begin inside a group
    "unaligned_segment": "error",  # free_segment from a position inside a page
    "tail_batch": "error",  # alloc_extend_swa_tail with two requests
    "tail_long": "error",  # alloc_extend_swa_tail with a tail longer than the extend
    "paged_on_token": "error",  # alloc_extend at page_size 1
    "decode_on_token": "error",  # alloc_decode at page_size 1
    "tail_on_token": "error",  # alloc_extend_swa_tail at page_size 1
    "pair_on_pure": "error",  # set_full_to_swa_mapping on a pure SWA allocator (identity mapping)
    "unpair_on_pure": "error",  # clear_full_to_swa_mapping on a pure SWA allocator
    "alloc_on_paged": "error",  # alloc(n) on a paged hybrid allocator
    "resize_grow": "error",  # resize above the built size
    # sglang 0.5.23's free_page_ids: unnoticed, except that its debug mode refuses them.
    "page_ids_twice": "debug",  # free_page_ids naming a request's last page twice
    "page_ids_padding": "debug",  # free_page_ids of page 0
    "page_ids_free": "debug",  # free_page_ids of a page that is free
}
# The breaks made on one live request's slots (Break.rid names it); the others name none.
ROW_BREAKS = ("free_unpaired", "free_full_paired", "segment_unpaired", "partial_page", "unaligned_segment")
GUARD_BREAKS = tuple(k for k, v in BREAKS.items() if v == "guard")
OTHER_BREAKS = tuple(k for k, v in BREAKS.items() if v not in ("guard", "debug"))
PAGE_ID_BREAKS = tuple(k for k, v in BREAKS.items() if v == "debug")


@dataclass(frozen=True)
class Break(Step):
    """A deliberate contract break of one of the kinds in BREAKS or PAGE_ID_BREAKS."""

    op: ClassVar[str] = "break"
    kind: str
    rid: int = -1


@dataclass(frozen=True)
class EvictSegment(Step):
    """Window eviction by segment (sglang 0.5.23): free_swa_segment of positions
    lo..hi-1, start_pos lo; free_swa of them where the target has no free_swa_segment."""

    op: ClassVar[str] = "evict_segment"
    rid: int
    lo: int
    hi: int


@dataclass(frozen=True)
class FreePages(Step):
    """A cache-style free by page id: the full pages under positions start.. of a
    request go back through full_attn_allocator.free_page_ids (free of their slots
    where it has none); the request keeps positions 0..start-1, or is finished at 0."""

    op: ClassVar[str] = "free_pages"
    rid: int
    start: int


STEP_TYPES: dict[str, type[Step]] = {
    cls.op: cls
    for cls in (
        Admit, AdmitTail, Extend, Decode, Evict, Repair, Finish, DropTail,
        GroupBegin, GroupEnd, MergeSort, Clear, Resize, Break, EvictSegment, FreePages,
        Prefill, Retract, Resume, CacheFree, Empty,
    )
}

# split: free of paired pages, free_full of the rest; free: one free; segments:
# free_segments by page; full_segments: split, its unpaired runs by free_full_segment;
# cache: the cache keeps the page-aligned part as an entry, the rest is freed.
FINISH_HOWS = ("split", "free", "segments", "full_segments", "cache")
CACHE_CALLS = ("free", "free_swa", "free_full")
EMPTY_CALLS = (
    "free", "free_swa", "free_full", "free_segment", "free_full_segment", "free_swa_segment",
    "alloc", "alloc_extend", "alloc_decode",
)
# Of those, the calls that exist at one kind of page size only.
TOKEN_CALLS, PAGED_CALLS = ("alloc",), ("alloc_extend", "alloc_decode")


class StepFormatError(ValueError):
    """A step that is not well formed; `field` names the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"field {field!r}: {message}")
        self.field = field


def _int(data: dict, name: str) -> int:
    v = data.get(name)
    if isinstance(v, bool) or not isinstance(v, int):
        raise StepFormatError(name, f"must be an integer, got {v!r}")
    return v


# Fields holding lists of integer tuples: their width and what each entry says.
_TUPLES = {"reqs": (2, "[rid, count]"), "batch": (4, "[rid, src, prefix, add]"), "pieces": (3, "[rid, lo, hi]")}


def _tuples(data: dict, name: str) -> tuple[tuple[int, ...], ...]:
    width, shape = _TUPLES[name]
    v = data.get(name)
    if not isinstance(v, list) or not v:
        raise StepFormatError(name, f"must be a non-empty list of {shape} entries, got {v!r}")
    out = []
    for item in v:
        if not (isinstance(item, list) and len(item) == width and all(isinstance(x, int) and not isinstance(x, bool) for x in item)):
            raise StepFormatError(name, f"each entry must be {shape} integers, got {item!r}")
        out.append(tuple(item))
    return tuple(out)


def step_from_json(data: Any) -> Step:
    """Build a step from its JSON form; raises StepFormatError naming the bad field."""
    if not isinstance(data, dict):
        raise StepFormatError("op", f"a step must be an object, got {type(data).__name__}")
    op = data.get("op")
    cls = STEP_TYPES.get(op) if isinstance(op, str) else None
    if cls is None:
        raise StepFormatError("op", f"unknown op {op!r}; known: {', '.join(STEP_TYPES)}")
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in data and f.default is not dataclasses.MISSING:
            continue
        if f.name not in data:
            raise StepFormatError(f.name, f"missing from a {op!r} step")
        if f.name in _TUPLES:
            kwargs[f.name] = _tuples(data, f.name)
        elif f.name == "rids":
            v = data[f.name]
            if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                raise StepFormatError(f.name, f"must be a non-empty list of integers, got {v!r}")
            kwargs[f.name] = tuple(v)
        elif f.name in ("interleave", "swa_int32"):
            if not isinstance(data[f.name], bool):
                raise StepFormatError(f.name, f"must be true or false, got {data[f.name]!r}")
            kwargs[f.name] = data[f.name]
        elif f.name in ("how", "kind", "call"):
            v = data[f.name]
            allowed = {"how": FINISH_HOWS, "kind": BREAKS, "call": EMPTY_CALLS if cls is Empty else CACHE_CALLS}[f.name]
            if v not in allowed:
                raise StepFormatError(f.name, f"must be one of {', '.join(allowed)}, got {v!r}")
            kwargs[f.name] = v
        else:
            kwargs[f.name] = _int(data, f.name)
    extra = set(data) - {"op"} - {f.name for f in dataclasses.fields(cls)}
    if extra:
        raise StepFormatError(sorted(extra)[0], f"not a field of a {op!r} step")
    return cls(**kwargs)
