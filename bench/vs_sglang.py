"""The bundled allocator against the installed sglang's own, on the same workloads (SPEC 6).

    python bench/vs_sglang.py [--quick] [--sort] [--only OP]

Both hybrid allocators (sglang's ``SWATokenToKVPoolAllocator`` over its own
``SWAKVPool``, built by ``properties.sglang_target.make``; the impl by
``impl.make_allocator``) run in one process on CPU with one torch thread and
invariants at warn. Every cell alternates rounds between the two so that
background load falls on both alike; a round runs each for about the same
wall time, and the reported ratio is the median over rounds of
sglang us/iter / impl us/iter (above 1: the impl is faster).

Workloads (inputs are built once, outside the timing, and shared by both):
  alloc_free     one 64-token request allocated, then freed
                 (page_size 1: alloc(64); otherwise alloc_extend from 0)
  cycle          4 requests: extend 128 tokens each, 16 decode steps, free
                 each request's row
  decode_heavy   64 requests: 8 rounds of (extend 8 tokens each, 32 decode
                 steps, one free of the batch's slots): 256 decodes
  mixed_prefill  4 requests extend 37/100/5/64 tokens; then one batch of 8:
                 those 4 continue (mid-page where their length says so, by
                 23/1/60/64 tokens) with 4 new ones of 1/17/200/3 tokens;
                 then every row is freed
At page_size 1 every extend and decode is ``alloc(n)``. A cell whose
workload cannot fit the pool is skipped and the table says why.

sglang is not a dependency: where it is not importable this prints the reason
and exits 0 (``bash scripts/install-sglang`` installs it for CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from impl import invariants  # noqa: E402
from impl.factory import make_allocator  # noqa: E402

SIZES = {"4K": 4 * 1024, "1M": 1024 * 1024}
PAGE_SIZES = (1, 16, 64)


def _i64(values):
    return torch.tensor(values, dtype=torch.int64)


def _ceil(a, b):
    return -(-a // b)


class Extend:
    """Inputs of one alloc_extend (or, at page_size 1, one alloc of the total)."""

    def __init__(self, prefix, seq):
        self.prefix, self.seq = _i64(prefix), _i64(seq)
        self.total = int((self.seq - self.prefix).sum())

    def run(self, a, ps, last_loc):
        if ps == 1:
            return a.alloc(self.total)
        return a.alloc_extend(self.prefix, self.prefix, self.seq, self.seq, last_loc, self.total)


def _decode_steps(start_len, batch, steps):
    return [_i64([start_len + k + 1] * batch) for k in range(steps)]


class AllocFree:
    name = "alloc_free"
    tokens = 64

    def __init__(self, ps):
        self.ext = Extend([0], [self.tokens])
        self.last = _i64([-1])

    def pages(self, ps):
        return _ceil(self.tokens, ps)

    def __call__(self, a, ps):
        a.free(self.ext.run(a, ps, self.last))


class Cycle:
    name = "cycle"
    batch, extend, decodes = 4, 128, 16

    def __init__(self, ps):
        self.ext = Extend([0] * self.batch, [self.extend] * self.batch)
        self.last = _i64([-1] * self.batch)
        self.seqs = _decode_steps(self.extend, self.batch, self.decodes)

    def pages(self, ps):
        return self.batch * _ceil(self.extend + self.decodes, ps)

    def __call__(self, a, ps):
        b = self.batch
        if ps == 1:
            heads = [a.alloc(self.extend) for _ in range(b)]
            steps = [a.alloc(b) for _ in range(self.decodes)]
        else:
            flat = self.ext.run(a, ps, self.last)
            heads = list(flat.view(b, self.extend))
            last = flat.view(b, self.extend)[:, -1]
            steps = []
            for seq in self.seqs:
                last = a.alloc_decode(seq, seq, last)
                steps.append(last)
        tails = torch.stack(steps, dim=1)
        for i in range(b):
            a.free(torch.cat((heads[i], tails[i])))


class DecodeHeavy:
    name = "decode_heavy"
    batch, prompt, decodes, rounds = 64, 8, 32, 8

    def __init__(self, ps):
        self.ext = Extend([0] * self.batch, [self.prompt] * self.batch)
        self.last = _i64([-1] * self.batch)
        self.seqs = _decode_steps(self.prompt, self.batch, self.decodes)

    def pages(self, ps):
        return self.batch * _ceil(self.prompt + self.decodes, ps)

    def __call__(self, a, ps):
        for _ in range(self.rounds):
            flat = self.ext.run(a, ps, self.last)
            parts = [flat]
            if ps == 1:
                for _ in self.seqs:
                    parts.append(a.alloc(self.batch))
            else:
                last = flat.view(self.batch, self.prompt)[:, -1]
                for seq in self.seqs:
                    last = a.alloc_decode(seq, seq, last)
                    parts.append(last)
            a.free(torch.cat(parts))


class MixedPrefill:
    name = "mixed_prefill"
    first = (37, 100, 5, 64)
    more = (23, 1, 60, 64)
    new = (1, 17, 200, 3)

    def __init__(self, ps):
        self.a = Extend([0] * 4, list(self.first))
        self.last_a = _i64([-1] * 4)
        pre = list(self.first) + [0] * 4
        seq = [p + m for p, m in zip(self.first, self.more)] + list(self.new)
        self.b = Extend(pre, seq)
        self.ends_a = torch.cumsum(self.a.seq, 0) - 1  # each first row's last slot, in the flat output
        self.none = _i64([-1] * 4)
        self.b_split = [int(x) for x in (self.b.seq - self.b.prefix)]
        self.a_split = list(self.first)

    def pages(self, ps):
        b = [_ceil(p + m, ps) for p, m in zip(self.first, self.more)]
        return sum(b) + sum(_ceil(n, ps) for n in self.new)

    def __call__(self, a, ps):
        flat_a = self.a.run(a, ps, self.last_a)
        last = torch.cat((flat_a[self.ends_a], self.none))
        flat_b = self.b.run(a, ps, last)
        rows_a = flat_a.split(self.a_split)
        rows_b = flat_b.split(self.b_split)
        for i in range(4):
            a.free(torch.cat((rows_a[i], rows_b[i])))
        for i in range(4, 8):
            a.free(rows_b[i])


WORKLOADS = (AllocFree, Cycle, DecodeHeavy, MixedPrefill)


def _build_impl(size, ps, need_sort):
    return make_allocator(dict(kind="hybrid", size=size, size_swa=size, page_size=ps,
                               need_sort=need_sort, check_level="warn"))


def _build_sglang(size, ps, need_sort):
    from properties import sglang_target

    return sglang_target.make(dict(kind="hybrid", size=size, size_swa=size, page_size=ps,
                                   device="cpu", need_sort=need_sort, check_level="warn"))


def _per_iter(op, a, ps, n):
    t0 = time.perf_counter()
    for _ in range(n):
        op(a, ps)
    return (time.perf_counter() - t0) / n


def measure(op, ps, size, need_sort, rounds, round_s):
    """Median us/iter of each side and the median per-round ratio sglang / impl."""
    sides = {"impl": _build_impl(size, ps, need_sort), "sglang": _build_sglang(size, ps, need_sort)}
    full = {k: a.available_size() for k, a in sides.items()}
    chunk = {}
    for k, a in sides.items():
        t = _per_iter(op, a, ps, 3)  # warm-up, and a first guess of the cost
        t = _per_iter(op, a, ps, max(1, int(0.2 * round_s / t)))
        chunk[k] = max(1, int(round_s / t))
    times = {k: [] for k in sides}
    for _ in range(rounds):
        for k, a in sides.items():
            times[k].append(_per_iter(op, a, ps, chunk[k]))
    for k, a in sides.items():
        # Every iteration gave back what it took.
        assert a.available_size() == full[k], (k, a.available_size(), full[k])
    ratio = statistics.median(s / i for s, i in zip(times["sglang"], times["impl"]))
    return statistics.median(times["impl"]), statistics.median(times["sglang"]), ratio


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 short rounds per cell (a smoke run)")
    ap.add_argument("--sort", action="store_true", help="need_sort on (default off)")
    ap.add_argument("--only", action="append", default=[], help="run only this workload (repeatable)")
    ap.add_argument("--page-size", type=int, action="append", default=[], help="only this page size (repeatable)")
    args = ap.parse_args(argv)

    from properties import sglang_target

    ok, what = sglang_target.available()
    if not ok:
        print(f"skipped: {what}")
        print(json.dumps({"skipped": what}))
        return 0

    torch.set_num_threads(1)
    invariants.set_level("warn")
    rounds, round_s = (3, 0.05) if args.quick else (7, 0.25)
    print(f"sglang {what} ({sglang_target.describe().split('; ', 1)[1]})")
    print(f"torch {torch.__version__}, 1 thread, cpu, hybrid, invariants warn, "
          f"need_sort {args.sort}, {rounds} alternated rounds per cell")
    head = f"{'op':<14} {'ps':>3} {'slots':>5} {'impl us':>10} {'sglang us':>10} {'ratio':>7}"
    print(head)
    print("-" * len(head))
    result = {}
    for cls in WORKLOADS:
        if args.only and cls.name not in args.only:
            continue
        for ps in args.page_size or PAGE_SIZES:
            op = cls(ps)
            for label, size in SIZES.items():
                have = size // ps - 1  # page 0 is the padding page
                if op.pages(ps) > have:
                    print(f"{cls.name:<14} {ps:>3} {label:>5}   skipped: needs {op.pages(ps)} pages, "
                          f"the pool has {have}")
                    continue
                t_impl, t_sg, ratio = measure(op, ps, size, args.sort, rounds, round_s)
                print(f"{cls.name:<14} {ps:>3} {label:>5} {t_impl * 1e6:>10,.1f} {t_sg * 1e6:>10,.1f} {ratio:>7.2f}")
                result[f"{cls.name}/ps{ps}/{label}"] = round(ratio, 2)
    if result:
        paged = [r for k, r in result.items() if "/ps1/" not in k]
        print(f"min ratio {min(result.values()):.2f} (goal >= 1); "
              f"min at page_size > 1 {min(paged) if paged else float('nan'):.2f} (goal >= 3)")
    print(json.dumps({"sglang_over_impl": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
