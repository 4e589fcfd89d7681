"""Lockstep step cost against the bare allocator calls of the same workload (SPEC 6).

The state machine's own workload (drawn by hypothesis, then kept as traces) replays
in lockstep against a recording proxy of the bundled allocator; the recorded calls
then replay on a fresh allocator with nothing else around them. Both are timed in this one run and the
table gives lockstep time / bare time, with the census every 16 steps and with it off (the
censuses before accepted contract breaks, around clear/resize and on restarts still run
then; a refused break is compared on raw state reads, timed as the driver's own), and the
census-every-16 run with the time of every census taken out; the census's own cost is given
per slot of the two pools.

    python bench/lockstep_cost.py [--steps N]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from impl import make_allocator  # noqa: E402
from properties.lockstep import Lockstep  # noqa: E402
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


def workload(config: dict, steps: int, seed: int = 0) -> list[list]:
    """Traces of the state machine's own workload on this configuration, `steps` in
    all: hypothesis draws them (seeded), each example's steps kept at its teardown."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis import seed as hseed
    from hypothesis.stateful import run_state_machine_as_test

    traces: list[list] = []
    base = machine_for(make_allocator, fixed=config)

    class Collect(base):
        def teardown(self):
            if self.ls is not None and sum(map(len, traces)) < steps:
                traces.append(list(self.ls.trace))
            super().teardown()

    while sum(map(len, traces)) < steps:
        hseed(seed)(lambda: run_state_machine_as_test(Collect, settings=settings(
            max_examples=max(1, (steps - sum(map(len, traces))) // 20), stateful_step_count=40, deadline=None,
            database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))))()
        seed += 1
    return traces


class CensusClock:
    """Times every census the driver runs (the periodic ones, and those before a
    contract break, after clear/resize and on a restart), by wrapping
    ``Lockstep.census_violations`` for the length of a drive."""

    def __init__(self):
        self.seconds, self.calls = 0.0, 0

    def __enter__(self):
        inner = self._inner = Lockstep.census_violations

        def timed(ls):
            t0 = time.perf_counter()
            try:
                return inner(ls)
            finally:
                self.seconds += time.perf_counter() - t0
                self.calls += 1

        Lockstep.census_violations = timed
        return self

    def __exit__(self, *exc):
        Lockstep.census_violations = self._inner


def drive(config: dict, traces: list[list], census_every: int, log: list | None, clock: CensusClock | None = None) -> float:
    """Replay the traces in lockstep; returns the seconds taken."""
    def target(c):
        if log is None:
            return make_allocator(c)
        log.append(((), None, (), {}))  # a new allocator from here on
        return Recorder(make_allocator(c), log)

    start = time.perf_counter()
    with clock or CensusClock():
        for steps in traces:
            ls = Lockstep(config, target, census_every=census_every)
            for step in steps:
                ls.run(step)
    return time.perf_counter() - start


def bare(config: dict, log: list) -> float:
    """The recorded calls alone, on a fresh allocator."""
    start = time.perf_counter()
    for path, name, args, kwargs in log:
        if name is None:
            alloc = make_allocator(dict(config))
            continue
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
        traces = workload(config, args.steps)
        n = sum(map(len, traces))
        log: list = []
        drive(config, traces, 16, log)  # records the calls of exactly this workload
        t_bare = bare(config, log)
        clock = CensusClock()
        t_census = drive(config, traces, 16, None, clock)
        t_no_census = drive(config, traces, 0, None)
        slots = config["size"] + config["size_swa"]
        rows.append((ps, n, len(log), t_bare, t_census, t_no_census, clock, slots))
    print(f"{'ps':>3} {'steps':>6} {'calls':>6} {'bare us/step':>13} {'lockstep us/step':>17} {'ratio':>6} "
          f"{'no census':>10} {'ratio':>6} {'census excl.':>13} {'ratio':>6} {'censuses':>9} {'ns/slot':>8}")
    out = {}
    for ps, n, calls, tb, tc, tn, clock, slots in rows:
        us = lambda t: 1e6 * t / n
        excl = tc - clock.seconds  # the census-every-16 drive without any census's time
        per_slot = 1e9 * clock.seconds / max(1, clock.calls) / slots
        print(f"{ps:>3} {n:>6} {calls:>6} {us(tb):>13.1f} {us(tc):>17.1f} {tc / tb:>6.1f} {us(tn):>10.1f} {tn / tb:>6.1f} "
              f"{us(excl):>13.1f} {excl / tb:>6.1f} {clock.calls:>9} {per_slot:>8.0f}")
        out[f"ps{ps}"] = {"lockstep_over_bare": round(tc / tb, 2), "no_census_over_bare": round(tn / tb, 2),
                          "census_excluded_over_bare": round(excl / tb, 2), "census_ns_per_slot": round(per_slot, 1)}
    print("census excluded: the census-every-16 run less the time of every census in it "
          "(goal <= 3.0); ns/slot: one census's time over the slots of both pools")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
