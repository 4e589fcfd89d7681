"""Lockstep step cost against the bare allocator calls of the same workload (SPEC 6).

A random workload drives the state machine's own rules (no hypothesis) against a
recording proxy of the bundled allocator; the recorded calls then replay on a fresh
allocator with nothing else around them. Both are timed in this one run and the
table gives lockstep time / bare time, with the census every 16 steps and with it off.

    python bench/lockstep_cost.py [--steps N]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from impl import make_allocator  # noqa: E402
from properties.machine import machine_for  # noqa: E402

# Calls that change an allocator; everything else the driver does is observation.
MUTATING = {
    "alloc", "alloc_extend", "alloc_decode", "alloc_extend_swa_tail", "free", "free_swa",
    "free_full", "free_segment", "free_segments", "free_full_segment", "free_group_begin",
    "free_group_end", "set_full_to_swa_mapping", "clear", "resize", "merge_and_sort_free",
}
SUBS = {"full_attn_allocator", "swa_attn_allocator", "_req_to_token_pool"}


def _copy(x):
    if isinstance(x, torch.Tensor):
        return x.clone()  # the driver overwrites its row views later
    if isinstance(x, (list, tuple)):
        return type(x)(_copy(v) for v in x)
    return x


class Recorder:
    """Passes everything through and logs mutating calls with copies of their arguments."""

    def __init__(self, inner, log, path=()):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        if name in SUBS and value is not None:
            return Recorder(value, self._log, self._path + (name,))
        if name in MUTATING or (self._path == ("_req_to_token_pool",) and name in ("alloc", "free")):
            def call(*args, **kwargs):
                self._log.append((self._path, name, _copy(args), _copy(kwargs)))
                return value(*args, **kwargs)
            return call
        return value


WEIGHTS = {"admit": 3, "extend": 2, "decode": 5, "evict": 2, "repair": 1, "finish": 2, "drop_tail": 1, "group": 1}


def drive(config: dict, steps: int, census_every: int, log: list | None, seed: int = 0) -> float:
    """Run `steps` random workload steps in lockstep; returns the seconds taken."""
    target = (lambda c: Recorder(make_allocator(c), log)) if log is not None else make_allocator
    machine = machine_for(target, census_every=census_every)()
    machine.init(config)
    rng = random.Random(seed)
    ops, weights = zip(*WEIGHTS.items())
    n = 0
    start = time.perf_counter()
    while n < steps:
        op = rng.choices(ops, weights)[0]
        ls = machine.ls
        if op != "admit" and op != "group" and not ls.rows:
            op = "admit"
        if op == "repair" and ls.pure:
            op = "decode"
        r = lambda: rng.randrange(64)
        if op == "admit":
            machine.admit(lengths=[rng.randrange(1, 64) for _ in range(rng.randrange(1, 4))])
        elif op == "extend":
            machine.extend(picks=[r()], add=rng.randrange(1, 64))
        elif op == "decode":
            machine.decode(picks=list({r() for _ in range(4)}))
        elif op == "evict":
            machine.evict(pick=r(), span=rng.randrange(1, 64))
        elif op == "repair":
            machine.repair(pick=r(), n=rng.randrange(1, 64), offset=rng.randrange(16))
        elif op == "finish":
            machine.finish(pick=r(), how=rng.choice(("split", "free", "segments")))
        elif op == "drop_tail":
            machine.drop_tail(pick=r(), keep=r())
        elif ls.model.group_open:
            machine.group_end()
        else:
            machine.group_begin()
        n += 1
    return time.perf_counter() - start


def bare(config: dict, log: list) -> float:
    """The recorded calls alone, on a fresh allocator."""
    alloc = make_allocator(dict(config))
    start = time.perf_counter()
    for path, name, args, kwargs in log:
        obj = alloc
        for attr in path:
            obj = getattr(obj, attr)
        try:
            getattr(obj, name)(*args, **kwargs)
        except Exception:
            pass  # a refused call costs what it costs in both runs
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for ps in (1, 16):
        config = {"kind": "hybrid", "size": 4096, "size_swa": 2048, "page_size": ps, "device": "cpu",
                  "need_sort": False, "ring_size": None, "req_slots": None, "check_level": "warn"}
        log: list = []
        drive(config, args.steps, 16, log)  # records the calls of exactly this workload
        t_bare = bare(config, log)
        t_census = drive(config, args.steps, 16, None)
        t_no_census = drive(config, args.steps, 0, None)
        rows.append((ps, len(log), t_bare, t_census, t_no_census))
    print(f"{'ps':>3} {'steps':>6} {'calls':>6} {'bare us/step':>13} {'lockstep us/step':>17} {'ratio':>6} {'no census':>10} {'ratio':>6}")
    for ps, calls, tb, tc, tn in rows:
        us = lambda t: 1e6 * t / args.steps
        print(f"{ps:>3} {args.steps:>6} {calls:>6} {us(tb):>13.1f} {us(tc):>17.1f} {tc / tb:>6.1f} {us(tn):>10.1f} {tn / tb:>6.1f}")


if __name__ == "__main__":
    main()
