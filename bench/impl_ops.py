"""Per-call cost of the bundled allocator at a 4K-slot and a 1M-slot pool.

    python bench/impl_ops.py [--quick]

A call must cost O(slots it touches), never O(pool), so the 1M/4K ratio of
each row should stay near 1 (goal: <= 1.5). Both pools run the same number
of iterations, chosen so the 1M pool's free list drains and is merged back
at least once: the staging merge is part of the cost, amortized as it is in
a real run.

Rows (hybrid allocator, CPU, one torch thread):
  alloc+free    one request of 64 tokens allocated, then freed
                (page_size 1: alloc(64); page_size 16: alloc_extend from 0)
  cycle         a batch of 4 requests: extend 128 tokens each, 16 decode
                steps, free every row (page_size 1: alloc for both)
Both with need_sort off and on.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from impl import invariants  # noqa: E402
from impl.factory import make_allocator  # noqa: E402

SMALL, LARGE = 4 * 1024, 1024 * 1024
ALLOC_TOKENS = 64
BATCH, EXTEND, DECODE_STEPS = 4, 128, 16


def _i64(values):
    return torch.tensor(values, dtype=torch.int64)


def _build(size, page_size, need_sort):
    return make_allocator(
        dict(kind="hybrid", size=size, size_swa=size, page_size=page_size,
             need_sort=need_sort, check_level="warn")
    )


def alloc_free(a, page_size):
    """One iteration: allocate a 64-token request, free it."""
    if page_size == 1:
        row = a.alloc(ALLOC_TOKENS)
    else:
        pre, seq = _i64([0]), _i64([ALLOC_TOKENS])
        row = a.alloc_extend(pre, pre, seq, seq, _i64([-1]), ALLOC_TOKENS)
    a.free(row)


def cycle(a, page_size):
    """One iteration: extend a batch, decode it a few steps, free every row."""
    if page_size == 1:
        rows = [a.alloc(EXTEND) for _ in range(BATCH)]
        for _ in range(DECODE_STEPS):
            step = a.alloc(BATCH)
            rows = [torch.cat([r, step[i : i + 1]]) for i, r in enumerate(rows)]
    else:
        pre = _i64([0] * BATCH)
        seq = _i64([EXTEND] * BATCH)
        flat = a.alloc_extend(pre, pre, seq, seq, _i64([-1] * BATCH), BATCH * EXTEND)
        rows = list(flat.view(BATCH, EXTEND))
        last = flat.view(BATCH, EXTEND)[:, -1].clone()
        for step in range(DECODE_STEPS):
            seq = _i64([EXTEND + step + 1] * BATCH)
            new = a.alloc_decode(seq, seq, last)
            rows = [torch.cat([r, new[i : i + 1]]) for i, r in enumerate(rows)]
            last = new
    for r in rows:
        a.free(r)


def tokens_per_iter(op):
    return ALLOC_TOKENS if op is alloc_free else BATCH * (EXTEND + DECODE_STEPS)


def measure_pair(op, page_size, need_sort, iters, rounds):
    """Mean seconds per iteration at the 4K and the 1M pool.

    The two pools run in alternating rounds so that background load on the
    machine falls on both alike.
    """
    pools = {size: _build(size, page_size, need_sort) for size in (SMALL, LARGE)}
    spent = {size: 0.0 for size in pools}
    for a in pools.values():
        for _ in range(min(50, iters)):
            op(a, page_size)
    chunk = max(1, iters // rounds)
    for _ in range(rounds):
        for size, a in pools.items():
            t0 = time.perf_counter()
            for _ in range(chunk):
                op(a, page_size)
            spent[size] += time.perf_counter() - t0
    for a in pools.values():
        # Every iteration returned what it took.
        assert a.available_size() == min(a.size_full, a.size_swa) // page_size * page_size
    done = chunk * rounds
    return spent[SMALL] / done, spent[LARGE] / done, done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    invariants.set_level("warn")

    rows = []
    for op in (alloc_free, cycle):
        for page_size in (1, 16):
            for need_sort in (False, True):
                # Enough iterations to drain the 1M pool's free list once.
                iters = int(1.1 * LARGE / tokens_per_iter(op)) + 1
                rounds = 10
                if args.quick:
                    iters, rounds = 200, 2
                small, large, done = measure_pair(op, page_size, need_sort, iters, rounds)
                rows.append((op.__name__, page_size, need_sort, done, small, large))

    head = f"{'op':<11} {'ps':>3} {'sort':>5} {'iters':>6} {'4K us':>9} {'1M us':>9} {'1M/4K':>6}"
    print(f"torch {torch.__version__}, 1 thread, device cpu, invariants warn")
    print(head)
    print("-" * len(head))
    worst = 0.0
    for name, ps, srt, iters, small, large in rows:
        ratio = large / small
        worst = max(worst, ratio)
        print(
            f"{name:<11} {ps:>3} {str(srt):>5} {iters:>6} {small * 1e6:>9.1f} "
            f"{large * 1e6:>9.1f} {ratio:>6.2f}"
        )
    print(f"worst ratio {worst:.2f} (goal <= 1.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
