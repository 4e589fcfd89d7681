"""The coverage table of SPEC 4.6: each method of the target by the argument shapes the
workload sent it (batch size, prefix kinds, concatenated frees, empty input, one pool
short, ...).

The driver counts a (method, shape) cell for every call it sends; `REQUIRED` is the
table the ci profile must fill, and `render` prints it at the end of a campaign.
"""

from __future__ import annotations

from collections import Counter

_SHORT = ("short: none", "short: full", "short: swa", "short: both")
# sglang's debug mode (SGLANG_DEBUG_MEMORY_POOL) sends a paged hybrid's calls down
# their own checked paths, which a run without it never executes.
DEBUG_CELL = "debug mode, paged hybrid"

# Every cell here is reachable by the workload; a test shows the ci profile reaches each.
# Shapes the workload makes that the ci profile reached only a few times when last
# measured are counted and printed, not required: an interleaved free, a free_swa over
# several cached entries, free_segments of 5 or more segments, a paged extend that
# leaves a large pool over half full (22 calls in one sample, none in the next, while
# alloc at page size 1 reached it in both).
REQUIRED: dict[str, tuple[str, ...]] = {
    "alloc": ("batch 1", "batch 2-4", "batch 5-16", "batch 17-128", "batch 129+", "prefix: zero", "prefix: aligned", "prefix: mixed", *_SHORT, "empty input",
              "pool over 90 % full", "large pool over half full"),
    "alloc_extend": (
        "batch 1", "batch 2-4", "batch 5-16", "batch 17-128", "batch 129+",
        "prefix: zero", "prefix: aligned", "prefix: unaligned", "prefix: mixed", *_SHORT, "empty input",
        "pool over 90 % full", DEBUG_CELL,
    ),
    "alloc_decode": (
        "batch 1", "batch 2-4", "batch 5-16", "batch 17-128", "batch 129+",
        "new page: none", "new page: some", "new page: all",
        "order: sorted", "order: unsorted", "short: none", "short: full", "short: swa", "empty input", DEBUG_CELL,
        "batch 17+, short: swa",
    ),
    "free": ("pieces: one request", "pieces: several requests", "empty input", DEBUG_CELL),
    "free_swa": ("pieces: one request", "empty input"),
    "free_full": ("pieces: one request", "pieces: several requests", "empty input"),
    "free_segment": ("pieces: one request", "empty input"),
    "free_full_segment": ("pieces: one request", "empty input"),
    "free_swa_segment": ("pieces: one request", "empty input", DEBUG_CELL),
    "free_segments": ("segments 1", "segments 2-4"),
    "get_cpu_copy": ("positions 1", "positions 2-4", "positions 5-16", "positions 17-128", "positions 129+"),
    "load_cpu_copy": ("positions 1", "positions 2-4", "positions 5-16", "positions 17-128", "positions 129+"),
    "merge_and_sort_free": ("hybrid", "pure"),
    "new_pages_available": ("enough", "short"),
    # Module functions (observe.MODULE_FUNCTIONS): the page count a scheduler sizes a
    # paged batch by, and the layout kernels' torch stand-ins, held to each paged call.
    "get_num_new_pages": ("extend", "decode"),
    "alloc_extend_naive": ("new pages: none", "new pages: some"),
    "alloc_decode_naive": ("new pages: none", "new pages: some"),
    "translate_loc_from_full_to_swa": (
        "via the KV pool's translate_loc_from_full_to_swa",
        "via translate_loc_from_full_to_swa",
        "via translate_swa_indices_for_transfer",
    ),
}


def missing(shapes: Counter) -> list[tuple[str, str]]:
    """Required cells no call reached."""
    return [(m, cell) for m, cells in REQUIRED.items() for cell in cells if not shapes[(m, cell)]]


def render(shapes: Counter) -> str:
    """The table: one line per method, each cell with its count; unreached cells shown
    as 0 and listed at the end."""
    lines = ["coverage (calls sent, by method and argument shape):"]
    methods = list(REQUIRED) + sorted({m for m, _ in shapes} - set(REQUIRED))
    width = max(len(m) for m in methods)
    for m in methods:
        cells = list(REQUIRED.get(m, ())) + sorted({c for mm, c in shapes if mm == m} - set(REQUIRED.get(m, ())))
        lines.append(f"  {m:<{width}}  " + ", ".join(f"{c} {shapes[(m, c)]}" for c in cells))
    gaps = missing(shapes)
    lines.append(f"  {len(gaps)} required cells not reached" + (": " + "; ".join(f"{m} [{c}]" for m, c in gaps) if gaps else ""))
    return "\n".join(lines)
