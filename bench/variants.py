"""Per seeded-bug variant: time to the first failure and the shrunk counterexample (SPEC 6).

One run, fixed seed (hypothesis derandomized, the CI profile's budget): for each
variant the lockstep machine searches until its first failure; that trace is then
cut by `properties.lockstep.minimize` (step deletion, as campaigns do after
hypothesis's own shrink, which can take minutes per variant and is left out here).
Printed: the seconds to the first failure, the invariant it named, the trace's
step count at the failure and after cutting, and the seconds the cutting took.

    CI=true .venv/bin/python -m bench.variants [NAME ...]
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("CI", "true")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hypothesis import Phase, settings  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402

from fuzz.variants import EXPECTED, VARIANTS  # noqa: E402
from impl import invariants  # noqa: E402
from properties.lockstep import LockstepFailure, minimize  # noqa: E402
from properties.machine import machine_for  # noqa: E402
from properties.profiles import default_profile  # noqa: E402

settings.load_profile(default_profile())


def measure(name: str) -> dict:
    invariants.set_level(None)
    invariants.reset_hits()
    base = machine_for(VARIANTS[name])
    first: dict = {}
    start = time.perf_counter()

    class Timed(base):  # records the first failure the search meets
        def _go(self, step):
            try:
                super()._go(step)
            except LockstepFailure as e:
                first.setdefault("t", time.perf_counter() - start)
                first.setdefault("inv", e.invariant)
                raise

    row = {"name": name, "expected": EXPECTED.get(name, "?")}
    try:
        run_state_machine_as_test(Timed, settings=settings(database=None, derandomize=True, phases=[Phase.generate]))
        row.update(first=None, first_inv=None)
        return row
    except LockstepFailure as e:
        found = e
    row.update(first=first.get("t"), first_inv=found.invariant if "t" in first else f"{found.invariant} (at init)")
    row.update(raw_steps=len(found.steps or ()))
    t0 = time.perf_counter()
    steps, again = minimize(found.config, found.steps or [], VARIANTS[name], found.invariant)
    row.update(cut_steps=len(steps), cut_s=time.perf_counter() - t0)
    return row


def main(argv: list[str]) -> int:
    names = argv or list(VARIANTS)
    print(f"{'variant':28} {'first s':>8} {'first invariant':26} {'steps':>5} {'cut to':>6} {'cut s':>6}")
    for name in names:
        r = measure(name)
        if r["first_inv"] is None:
            print(f"{name:28} {'-':>8} {'not found':26}", flush=True)
            continue
        first = "init" if r["first"] is None else f"{r['first']:.2f}"
        print(f"{name:28} {first:>8} {r['first_inv']:26} {r['raw_steps']:>5} {r['cut_steps']:>6} {r['cut_s']:>6.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
