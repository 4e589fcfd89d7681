"""What `python -m fuzz show` costs on a 1M-slot pool against a 4K-slot one.

The same workload (two long requests, a window eviction, a finish, a dropped tail)
runs at both sizes, at page sizes 1 and 16. Measured in one run:

- replay: the bare lockstep replay of the trace (the driver's own cost, its O(pool)
  censuses included), which `show` pays once, and once more for a page;
- map: reading the map at the last step (`fuzz.show.snapshot`: the whole-pool
  comparison, once, then the drawn pages) and drawing it for the terminal;
- page: drawing the HTML page from what `show` collected.

The map is what must stay far below a second at 1M slots: it never walks the pool in
Python per slot. Ends with one line of JSON.

    python bench/show_cost.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from fuzz import campaign, show, show_render
from fuzz import trace as trace_mod
from properties.lockstep import replay
from properties.steps import Admit, Decode, DropTail, Evict, Extend, Finish

SIZES = {"4K": 4096, "1M": 1_000_000}


def workload(size: int, ps: int) -> trace_mod.Trace:
    n = min(3000, size // 4)
    steps = [
        Admit(((0, n), (1, 50))),
        Extend(((0, 100),)),
        Decode((0, 1)),
        Evict(0, 0, (n // 2) // ps * ps or ps),
        Admit(((2, 7),)),
        Finish(1, "split"),
        DropTail(0, n // 3),
    ]
    config = {"kind": "hybrid", "size": size, "size_swa": size // 2, "page_size": ps, "check_level": "strict"}
    return trace_mod.Trace(name=f"bench-{size}-{ps}", expect="pass", config=config, steps=steps)


def measure(size: int, ps: int, rounds: int) -> dict:
    t = workload(size, ps)
    factory = campaign.resolve("impl")
    times = {"replay": [], "map": [], "text": [], "show": [], "page": []}
    lines = 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        ls = replay(dict(t.config), t.steps, factory)
        t1 = time.perf_counter()
        # The map alone, at the replayed state: the touched rows are the hints show uses.
        hints = {"full": [sorted({s // ps for row in ls.rows.values() for s in row.slots[:64]})]}
        snap = show.snapshot(ls.model, ls.alloc, ls.config, len(t.steps) - 1, "last", hints, (), ls.rows)
        t2 = time.perf_counter()
        lines = sum(len(show_render.pool_lines(pm)) for pm in snap.pools)
        t3 = time.perf_counter()
        shown = show.show(t, factory, "impl", page=True)
        t4 = time.perf_counter()
        html = show_render.page(shown)
        t5 = time.perf_counter()
        for k, v in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            times[k].append(v)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["map_lines"] = lines
    out["page_bytes"] = len(html)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    result = {}
    print(f"{'size':>4} {'ps':>3} {'replay s':>9} {'map+text s':>11} {'show+page s':>12} {'page s':>7} {'map lines':>10} {'page KB':>8}")
    for ps in (1, 16):
        for name, size in SIZES.items():
            r = measure(size, ps, args.rounds)
            result[f"{name}_ps{ps}"] = r
            print(
                f"{name:>4} {ps:>3} {r['replay']:9.3f} {r['map'] + r['text']:11.3f} {r['show']:12.3f} {r['page']:7.3f} "
                f"{r['map_lines']:10d} {r['page_bytes'] / 1024:8.1f}"
            )
    summary = {}
    for ps in (1, 16):
        big, small = result[f"1M_ps{ps}"], result[f"4K_ps{ps}"]
        summary[f"ps{ps}"] = {
            "map_1M_s": round(big["map"] + big["text"], 4),
            "map_1M_over_4K": round((big["map"] + big["text"]) / (small["map"] + small["text"]), 2),
            "map_over_replay_1M": round((big["map"] + big["text"]) / big["replay"], 3),
            "show_page_over_replay_1M": round(big["show"] / big["replay"], 2),
            "page_1M_s": round(big["page"], 4),
            "map_lines_1M": big["map_lines"],
        }
    print(json.dumps({"bench": "show_cost", "rounds": args.rounds, **summary}))


if __name__ == "__main__":
    main()
