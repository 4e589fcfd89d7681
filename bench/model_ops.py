"""Per-call cost of the reference model at a 4K-slot and a 1M-slot pool (SPEC 3, 6).

The model must cost O(slots a call touches), never O(pool): the same call sequence on
a 1M-slot pool should cost about what it costs on a 4K one (goal: ratio <= 1.5).
Model() construction and census/self_check walk the whole pool by design and are
outside the timed part. Each cycle reuses fixed pages, so what is timed is the
model's bookkeeping, not a page search.

    python bench/model_ops.py [--reps N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference import Model, layout  # noqa: E402

SIZES = (4096, 1 << 20)


def _check(v):
    if v:
        raise AssertionError([str(x) for x in v])


def alloc_free(size: int, ps: int, reps: int) -> tuple[float, int]:
    """alloc (or alloc_extend from prefix 0 when paged) of 32 slots, then free."""
    m = Model("hybrid", size, size, ps)
    n = 32
    pages = list(range(1, n // ps + 1)) if ps > 1 else list(range(1, n + 1))
    spages = list(range(2, 2 + len(pages)))
    full = layout.expand_to_pages([p * ps for p in pages], ps)
    swa = layout.expand_to_pages([p * ps for p in spages], ps)
    calls = 0
    t0 = time.perf_counter()
    for _ in range(reps):
        if ps == 1:
            _check(m.alloc(n, full, swa, [0] * n))
        else:
            _check(m.alloc_extend([0], [n], [-1], full, swa, [0]))
        _check(m.free("free", full))
        calls += 2
    return time.perf_counter() - t0, calls


def extend_decode_free(size: int, ps: int, reps: int) -> tuple[float, int]:
    """A request: extend 20 positions, 2 chunks of 10 more, 12 decodes, then free."""
    m = Model("hybrid", size, size, ps)
    total = 20 + 2 * 10 + 12
    npages = layout.pages_spanned(total, ps)
    fpages = list(range(1, npages + 1))
    spages = list(range(3, npages + 3))
    calls = 0
    t0 = time.perf_counter()
    for _ in range(reps):
        row: list[int] = []
        srow: list[int] = []
        used = 0

        def grow(p, s, decode):
            nonlocal used
            k = layout.new_pages(p, s, ps)
            last = row[-1] if p else -1
            slast = srow[-1] if p else -1
            if ps == 1:
                full = [fpages[used + i] for i in range(s - p)]
                swa = [spages[used + i] for i in range(s - p)]
                used += s - p
                _check(m.alloc(s - p, full, swa, [0] * (s - p)))
            else:
                full = layout.extend_layout(p, s, last, fpages[used : used + k], ps)
                swa = layout.extend_layout(p, s, slast, spages[used : used + k], ps)
                used += k
                if decode:
                    _check(m.alloc_decode([s], [last], full, swa, [0]))
                else:
                    _check(m.alloc_extend([p], [s], [last], full, swa, [0]))
            row.extend(full)
            srow.extend(swa)

        grow(0, 20, False)
        grow(20, 30, False)
        grow(30, 40, False)
        for L in range(40, total):
            grow(L, L + 1, True)
        _check(m.free("free", row))
        calls += 3 + (total - 40) + 1
    return time.perf_counter() - t0, calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1000)
    args = ap.parse_args()
    rows = []
    worst = 0.0
    for name, fn in (("alloc/free", alloc_free), ("extend/decode/free", extend_decode_free)):
        for ps in (1, 16):
            # Best of 5, the two sizes interleaved so load on the machine hits both alike.
            per = {size: float("inf") for size in SIZES}
            for size in SIZES:
                fn(size, ps, max(1, args.reps // 10))  # warm-up
            for _ in range(5):
                for size in SIZES:
                    t, calls = fn(size, ps, args.reps)
                    per[size] = min(per[size], t / calls * 1e6)
            ratio = per[SIZES[1]] / per[SIZES[0]]
            worst = max(worst, ratio)
            rows.append((name, ps, per[SIZES[0]], per[SIZES[1]], ratio))
    print(f"{'cycle':<20} {'page':>4} {'4K us/call':>11} {'1M us/call':>11} {'1M/4K':>7}")
    for name, ps, a, b, r in rows:
        print(f"{name:<20} {ps:>4} {a:>11.2f} {b:>11.2f} {r:>7.2f}")
    print(f"worst ratio {worst:.2f} (goal <= 1.5)")


if __name__ == "__main__":
    main()
