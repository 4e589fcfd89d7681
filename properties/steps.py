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


# Deliberate contract breaks (SPEC 3.2), by kind.
BREAKS = (
    "free_unpaired",  # free at page_size 1 of a position whose SWA peer is gone
    "free_full_paired",  # free_full of a position that still has an SWA peer
    "double_free",  # free again the slots of a finished request
    "never_allocated",  # free a slot on a free page
    "partial_page",  # free one position of a page whose others are in use
    "nested_group",  # free_group_begin inside a group
    "unaligned_segment",  # free_segment from a position inside a page
    "tail_batch",  # alloc_extend_swa_tail with two requests
    "tail_long",  # alloc_extend_swa_tail with a tail longer than the extend
    "paged_on_token",  # alloc_extend at page_size 1
    "alloc_on_paged",  # alloc(n) on a paged hybrid allocator
    "resize_grow",  # resize above the built size
)
# Breaks of sglang 0.5.23's free_page_ids (SPEC 2.6, 3.2), kept apart from BREAKS so
# that what the state machine draws from BREAKS stays as it was.
PAGE_ID_BREAKS = (
    "page_ids_twice",  # free_page_ids naming a request's last page twice
    "page_ids_padding",  # free_page_ids of page 0
    "page_ids_free",  # free_page_ids of a page that is free
)


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
    )
}

FINISH_HOWS = ("split", "free", "segments")


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


def _pairs(data: dict, name: str) -> tuple[tuple[int, int], ...]:
    v = data.get(name)
    if not isinstance(v, list) or not v:
        raise StepFormatError(name, f"must be a non-empty list of [rid, count] pairs, got {v!r}")
    out = []
    for item in v:
        if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in item)):
            raise StepFormatError(name, f"each entry must be [rid, count] integers, got {item!r}")
        out.append((item[0], item[1]))
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
        if f.name == "reqs":
            kwargs[f.name] = _pairs(data, f.name)
        elif f.name == "rids":
            v = data[f.name]
            if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                raise StepFormatError(f.name, f"must be a non-empty list of integers, got {v!r}")
            kwargs[f.name] = tuple(v)
        elif f.name in ("how", "kind"):
            v = data[f.name]
            allowed = FINISH_HOWS if f.name == "how" else BREAKS + PAGE_ID_BREAKS
            if v not in allowed:
                raise StepFormatError(f.name, f"must be one of {', '.join(allowed)}, got {v!r}")
            kwargs[f.name] = v
        else:
            kwargs[f.name] = _int(data, f.name)
    extra = set(data) - {"op"} - {f.name for f in dataclasses.fields(cls)}
    if extra:
        raise StepFormatError(sorted(extra)[0], f"not a field of a {op!r} step")
    return cls(**kwargs)
