"""How many examples reach the coverage table's rarest cells, four of them required,
and a radix cache's share of the workload (a benchmark of the generator's reach, not CI).

    python bench/reach.py [--examples N] [--runs R]

Runs the lockstep machine against the bundled impl on the ci profile's settings, not
derandomized (so each run is another sample) and without shrinking, R runs of N
examples, and counts the examples in which each cell below was reached at least once.
The ci profile's one derandomized search must reach every required cell
(tests/test_lockstep.py); a cell few examples reach is lost to any change that moves
its draws, so this is the number to raise. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import Phase, settings  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402

import properties.profiles  # noqa: E402,F401  (registers the profiles)
from properties.machine import machine_for  # noqa: E402
from properties.targets import resolve  # noqa: E402

# The first four are required (properties/coverage.py REQUIRED); the last two sit
# beside them: a large batch meeting the other short pool.
RARE = (
    ("alloc", "batch 129+"),
    ("alloc_extend", "batch 129+"),
    ("alloc_decode", "batch 129+"),
    ("alloc_decode", "batch 17+, short: swa"),
    ("alloc_decode", "batch 17+, short: full"),
    ("alloc", "batch 17+, short: swa"),
    # A radix cache's evictions over several entries (the first is required).
    ("free_full", "pieces: several requests"),
    ("free_swa", "pieces: several requests"),
)
# A radix cache's share: entries made, hit, shared while in use, taken over.
LABELS = (
    "finished into the cache",
    "prefill: cache hit",
    "prefill: cache hit on a prefix in use",
    "prefill: cached entry taken over mid-page",
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=300, help="examples a run (default 300)")
    p.add_argument("--runs", type=int, default=4, help="runs, each a fresh sample (default 4)")
    args = p.parse_args(argv)
    if min(args.examples, args.runs) < 1:
        p.error("--examples and --runs must be >= 1")
    reached: Counter = Counter()
    examples = 0

    class Counting(machine_for(resolve("impl"))):
        def teardown(self):
            nonlocal examples
            examples += 1
            # This example's own counts (the driver's, not the process-wide ones).
            if self.ls is not None:
                reached.update(cell for cell in RARE if self.ls.shapes[cell])
                reached.update(label for label in LABELS if self.ls.labels[label])
            super().teardown()

    s = settings(settings.get_profile("ci"), max_examples=args.examples, derandomize=False,
                 database=None, phases=[Phase.generate])
    t0 = time.monotonic()
    for run in range(args.runs):
        run_state_machine_as_test(Counting, settings=s)
        print(f"run {run + 1} of {args.runs}: {examples} examples so far", file=sys.stderr, flush=True)
    wall = time.monotonic() - t0
    print(f"examples {examples} ({args.runs} runs of {args.examples}), {wall:.0f} s")
    for method, cell in RARE:
        print(f"  {method} [{cell}]".ljust(48) + f"{reached[(method, cell)]}")
    for label in LABELS:
        print(f"  {label}".ljust(48) + f"{reached[label]}")
    print(json.dumps({"bench": "reach", "examples": examples, "wall_s": round(wall, 1),
                      "reached": {**{f"{m} [{c}]": reached[(m, c)] for m, c in RARE},
                                  **{label: reached[label] for label in LABELS}}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
